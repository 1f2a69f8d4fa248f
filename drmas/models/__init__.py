"""Model files: sources and directories, tiny builtins, priming, streamed HF writing, checkpoints, devices."""
