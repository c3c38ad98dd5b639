"""relaxc's default schedule rules for CPUs (dlight ``ScheduleRule``s, one per file), in the order
``schedules/default.py`` tries them."""

from schedules.cpu.basic import Basic
from schedules.cpu.dense import Dense
from schedules.cpu.rows import Rows
from schedules.cpu.tiled import Tiled
from schedules.cpu.winograd import Winograd

__all__ = ["Winograd", "Dense", "Rows", "Tiled", "Basic"]
