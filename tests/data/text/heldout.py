"""A small library for planning greenhouse irrigation.

Written for hybrid's perplexity tests (tests/data/text/heldout.py): original code, not taken from any project,
so it is held out from every training corpus. It is meant to read like ordinary Python, not to be run.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import json
import math
from collections import defaultdict
from typing import Dict, Iterable, Iterator, List, Optional, Tuple


class SoilKind(enum.Enum):
    SAND = "sand"
    LOAM = "loam"
    CLAY = "clay"
    PEAT = "peat"


# Litres of water a square metre of each soil holds before it drains.
FIELD_CAPACITY = {
    SoilKind.SAND: 9.0,
    SoilKind.LOAM: 21.5,
    SoilKind.CLAY: 30.0,
    SoilKind.PEAT: 42.0,
}


@dataclasses.dataclass
class Bed:
    name: str
    soil: SoilKind
    area_m2: float
    crop: str
    moisture: float = 0.5  # fraction of field capacity
    valve: Optional[int] = None

    def capacity_litres(self) -> float:
        return FIELD_CAPACITY[self.soil] * self.area_m2

    def deficit_litres(self, target: float = 0.8) -> float:
        """Water needed to bring the bed up to `target` of its capacity (0 when it is wetter)."""
        missing = max(0.0, target - self.moisture)
        return missing * self.capacity_litres()

    def add_water(self, litres: float) -> float:
        """Adds water and returns the litres that drained away."""
        capacity = self.capacity_litres()
        held = self.moisture * capacity + litres
        drained = max(0.0, held - capacity)
        self.moisture = min(1.0, held / capacity)
        return drained


@dataclasses.dataclass(order=True)
class Job:
    start_minute: int
    bed_name: str = dataclasses.field(compare=False)
    litres: float = dataclasses.field(compare=False)
    valve: int = dataclasses.field(compare=False)


class CropTable:
    """Daily water use per square metre, by crop and month."""

    def __init__(self) -> None:
        self._rows: Dict[str, List[float]] = {}

    def add(self, crop: str, monthly: Iterable[float]) -> None:
        values = [float(v) for v in monthly]
        if len(values) != 12:
            raise ValueError(f"crop {crop!r}: expected 12 monthly values, got {len(values)}")
        if any(v < 0 for v in values):
            raise ValueError(f"crop {crop!r}: water use cannot be negative")
        self._rows[crop] = values

    def use(self, crop: str, month: int) -> float:
        if not 1 <= month <= 12:
            raise ValueError(f"month must be in 1..12, got {month}")
        try:
            return self._rows[crop][month - 1]
        except KeyError:
            raise KeyError(f"no water table for crop {crop!r}") from None

    @classmethod
    def from_json(cls, text: str) -> "CropTable":
        table = cls()
        for crop, monthly in json.loads(text).items():
            table.add(crop, monthly)
        return table

    def crops(self) -> List[str]:
        return sorted(self._rows)


class Greenhouse:
    def __init__(self, beds: Iterable[Bed], table: CropTable, valves: int = 4,
                 flow_litres_per_minute: float = 12.0) -> None:
        self.beds = {bed.name: bed for bed in beds}
        self.table = table
        self.valves = valves
        self.flow = flow_litres_per_minute
        self.log: List[Tuple[int, str, float]] = []

    def evaporate(self, month: int, days: float = 1.0) -> None:
        """Lowers every bed's moisture by its crop's use over `days`."""
        for bed in self.beds.values():
            used = self.table.use(bed.crop, month) * bed.area_m2 * days
            held = bed.moisture * bed.capacity_litres() - used
            bed.moisture = max(0.0, held / bed.capacity_litres())

    def thirsty(self, threshold: float = 0.45) -> List[Bed]:
        beds = [bed for bed in self.beds.values() if bed.moisture < threshold]
        beds.sort(key=lambda bed: (bed.moisture, bed.name))
        return beds

    def plan(self, target: float = 0.8, start_minute: int = 300) -> List[Job]:
        """Assigns each thirsty bed to the valve that frees up first.

        Valves run one bed at a time; a bed takes deficit / flow minutes. Returns the jobs in start order.
        """
        free_at = [(start_minute, valve) for valve in range(self.valves)]
        heapq.heapify(free_at)
        jobs: List[Job] = []
        for bed in self.thirsty():
            litres = bed.deficit_litres(target)
            if litres <= 0.0:
                continue
            minute, valve = heapq.heappop(free_at)
            if bed.valve is not None and bed.valve != valve:
                # a bed wired to one valve waits for it
                heapq.heappush(free_at, (minute, valve))
                minute, valve = self._wait_for(free_at, bed.valve)
            jobs.append(Job(minute, bed.name, litres, valve))
            heapq.heappush(free_at, (minute + math.ceil(litres / self.flow), valve))
        jobs.sort()
        return jobs

    @staticmethod
    def _wait_for(free_at: List[Tuple[int, int]], valve: int) -> Tuple[int, int]:
        for i, (minute, v) in enumerate(free_at):
            if v == valve:
                free_at[i] = free_at[-1]
                free_at.pop()
                heapq.heapify(free_at)
                return minute, v
        raise LookupError(f"valve {valve} does not exist")

    def run(self, jobs: Iterable[Job]) -> float:
        drained = 0.0
        for job in jobs:
            bed = self.beds[job.bed_name]
            drained += bed.add_water(job.litres)
            self.log.append((job.start_minute, job.bed_name, job.litres))
        return drained

    def report(self) -> str:
        lines = ["bed          soil   moisture   crop"]
        for name in sorted(self.beds):
            bed = self.beds[name]
            lines.append(f"{name:<12} {bed.soil.value:<6} {bed.moisture:8.1%}   {bed.crop}")
        return "\n".join(lines)


def minutes_to_clock(minute: int) -> str:
    hours, minutes = divmod(minute % (24 * 60), 60)
    return f"{hours:02d}:{minutes:02d}"


def parse_clock(text: str) -> int:
    """'06:30' -> 390. Raises ValueError on anything else."""
    parts = text.strip().split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"not a clock time: {text!r}")
    hours, minutes = int(parts[0]), int(parts[1])
    if hours > 23 or minutes > 59:
        raise ValueError(f"clock time out of range: {text!r}")
    return hours * 60 + minutes


class RainGauge:
    """A rolling record of rainfall in millimetres, one reading per day."""

    def __init__(self, days: int = 7) -> None:
        if days <= 0:
            raise ValueError("the gauge must keep at least one day")
        self.days = days
        self.readings: List[float] = []

    def record(self, millimetres: float) -> None:
        if millimetres < 0 or math.isnan(millimetres):
            raise ValueError(f"bad reading {millimetres}")
        self.readings.append(millimetres)
        if len(self.readings) > self.days:
            del self.readings[0]

    def total(self) -> float:
        return sum(self.readings)

    def wet_days(self, threshold: float = 1.0) -> int:
        return sum(1 for r in self.readings if r >= threshold)

    def trend(self) -> float:
        """Slope of a least-squares line through the readings (mm per day)."""
        n = len(self.readings)
        if n < 2:
            return 0.0
        mean_x = (n - 1) / 2
        mean_y = self.total() / n
        num = sum((i - mean_x) * (y - mean_y) for i, y in enumerate(self.readings))
        den = sum((i - mean_x) ** 2 for i in range(n))
        return num / den


def skip_watering(gauge: RainGauge, forecast_mm: float) -> bool:
    """Greenhouse vents open in the rain: skip a day after a wet spell with more rain to come."""
    return gauge.wet_days() >= 3 and forecast_mm > 4.0 or gauge.total() > 60.0


def group_by_soil(beds: Iterable[Bed]) -> Dict[SoilKind, List[str]]:
    groups: Dict[SoilKind, List[str]] = defaultdict(list)
    for bed in beds:
        groups[bed.soil].append(bed.name)
    return {soil: sorted(names) for soil, names in groups.items()}


def weekly_litres(house: Greenhouse, month: int) -> Dict[str, float]:
    totals: Dict[str, float] = {}
    for name, bed in house.beds.items():
        totals[name] = round(house.table.use(bed.crop, month) * bed.area_m2 * 7, 1)
    return totals


def read_beds(lines: Iterable[str]) -> Iterator[Bed]:
    """Parses 'name, soil, area, crop[, valve]' lines; blank lines and # comments are skipped."""
    for number, raw in enumerate(lines, start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) not in (4, 5):
            raise ValueError(f"line {number}: expected 4 or 5 fields, got {len(fields)}")
        name, soil, area, crop = fields[:4]
        try:
            kind = SoilKind(soil.lower())
        except ValueError:
            raise ValueError(f"line {number}: unknown soil {soil!r}") from None
        valve = int(fields[4]) if len(fields) == 5 else None
        yield Bed(name=name, soil=kind, area_m2=float(area), crop=crop, valve=valve)


class Schedule:
    """Jobs per day, with a summary that the controller prints each morning."""

    def __init__(self) -> None:
        self.days: Dict[int, List[Job]] = defaultdict(list)

    def add_day(self, day: int, jobs: List[Job]) -> None:
        if day in self.days:
            raise KeyError(f"day {day} already planned")
        self.days[day] = list(jobs)

    def litres_on(self, day: int) -> float:
        return sum(job.litres for job in self.days.get(day, []))

    def busiest_valve(self, day: int) -> Optional[int]:
        usage: Dict[int, float] = defaultdict(float)
        for job in self.days.get(day, []):
            usage[job.valve] += job.litres
        if not usage:
            return None
        return max(usage, key=lambda valve: (usage[valve], -valve))

    def summary(self, day: int) -> str:
        jobs = self.days.get(day, [])
        if not jobs:
            return f"day {day}: nothing to water"
        first = minutes_to_clock(jobs[0].start_minute)
        return (f"day {day}: {len(jobs)} beds, {self.litres_on(day):.0f} litres, "
                f"first at {first}, busiest valve {self.busiest_valve(day)}")

    def to_json(self) -> str:
        return json.dumps({
            str(day): [dataclasses.asdict(job) for job in jobs]
            for day, jobs in sorted(self.days.items())
        }, indent=2)


def simulate(house: Greenhouse, month: int, days: int, gauge: RainGauge,
             forecast: List[float]) -> Schedule:
    schedule = Schedule()
    for day in range(days):
        house.evaporate(month)
        rain = forecast[day] if day < len(forecast) else 0.0
        gauge.record(rain)
        if skip_watering(gauge, rain):
            schedule.add_day(day, [])
            continue
        jobs = house.plan()
        house.run(jobs)
        schedule.add_day(day, jobs)
    return schedule


def test_deficit_is_zero_when_wet() -> None:
    bed = Bed("a1", SoilKind.LOAM, 2.0, "basil", moisture=0.9)
    assert bed.deficit_litres() == 0.0


def test_add_water_drains_the_excess() -> None:
    bed = Bed("a2", SoilKind.SAND, 1.0, "chard", moisture=0.9)
    drained = bed.add_water(5.0)
    assert math.isclose(drained, 0.9 * 9.0 + 5.0 - 9.0)
    assert bed.moisture == 1.0


def test_clock_round_trip() -> None:
    for minute in (0, 59, 60, 391, 1439):
        assert parse_clock(minutes_to_clock(minute)) == minute


def test_plan_respects_wired_valves() -> None:
    table = CropTable()
    table.add("tomato", [1, 1, 2, 3, 4, 5, 5, 5, 4, 3, 2, 1])
    beds = [Bed(f"b{i}", SoilKind.CLAY, 1.5, "tomato", moisture=0.2, valve=1) for i in range(3)]
    house = Greenhouse(beds, table, valves=3)
    jobs = house.plan()
    assert [job.valve for job in jobs] == [1, 1, 1]
    starts = [job.start_minute for job in jobs]
    assert starts == sorted(starts) and len(set(starts)) == 3


def test_trend_of_a_rising_gauge() -> None:
    gauge = RainGauge(days=4)
    for mm in (0.0, 1.0, 2.0, 3.0, 4.0):
        gauge.record(mm)
    assert gauge.readings == [1.0, 2.0, 3.0, 4.0]
    assert math.isclose(gauge.trend(), 1.0)


if __name__ == "__main__":
    crop_json = json.dumps({
        "tomato": [1, 1, 2, 3, 4, 5, 5, 5, 4, 3, 2, 1],
        "basil": [0.5, 0.5, 1, 1.5, 2, 2.5, 3, 3, 2, 1.5, 1, 0.5],
        "chard": [0.8] * 12,
    })
    beds_text = """
    # name, soil, area (m2), crop, valve
    north-1, loam, 4.0, tomato
    north-2, loam, 4.0, tomato, 2
    south-1, sand, 2.5, basil
    south-2, peat, 3.0, chard
    """
    house = Greenhouse(read_beds(beds_text.splitlines()), CropTable.from_json(crop_json))
    schedule = simulate(house, month=6, days=5, gauge=RainGauge(), forecast=[0, 0, 6, 8, 9])
    for day in sorted(schedule.days):
        print(schedule.summary(day))
    print(house.report())
