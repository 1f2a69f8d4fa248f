"""Learner-side maths: advantage normalisation, running reward statistics and the PPO policy loss."""
