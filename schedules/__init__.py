"""Kernel schedules: default rules per target, MetaSchedule tuning and the on-disk record cache."""
