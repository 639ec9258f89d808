"""The job process: the launcher, the training loop, the user's task and data, signals, reports, metrics."""
