"""relaxc's default schedule rules for CPUs (dlight ``ScheduleRule``s, one per file), in the order
``schedules/default.py`` tries them."""

from relaxc.schedules.cpu.basic import Basic
from relaxc.schedules.cpu.dense import Dense
from relaxc.schedules.cpu.int8 import Int8
from relaxc.schedules.cpu.rows import Rows
from relaxc.schedules.cpu.tiled import Tiled
from relaxc.schedules.cpu.winograd import Winograd

__all__ = ["Int8", "Winograd", "Dense", "Rows", "Tiled", "Basic"]
