"""relaxc's compile side: the pipeline, its options, tuning, profiling and the artifact it makes."""
