"""Kernel schedules: default rules per target, MetaSchedule tuning and the cache of what was measured."""
