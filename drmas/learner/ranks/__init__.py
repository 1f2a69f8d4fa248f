"""How one model's learner is spread over processes: one rank, or N FSDP2 ranks led by rank 0."""
