"""The rollout side of the weight channel: the receiver, its link thread, the receiving end of a pair,
and the stream that turns received units back into tensors."""
