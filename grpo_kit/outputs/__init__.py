"""What a run writes: metrics loggers, trackers, the sample log, checkpoints, the plugin lock."""
