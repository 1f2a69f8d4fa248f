"""The learner side of the weight channel: the sender, its control thread, its book of joined rollouts,
and one transfer of the weights."""
