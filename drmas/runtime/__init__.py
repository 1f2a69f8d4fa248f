"""Process plumbing shared by the pipeline's processes: signals and logging, endpoints, CURVE keys and
the network policy, run directories, metrics and the run report."""
