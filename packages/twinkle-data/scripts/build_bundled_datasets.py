"""Build the bundled datasets: self-cognition, a GSM8K-style set and a Countdown-style set.

Everything comes from this repository, so running the script twice gives
byte-identical files:

- ``self-cognition/train.jsonl``: the hand-written pairs in ``self_cognition.txt``,
  Chinese and English interleaved, as ``{"query", "response", "tag"}`` rows;
- ``gsm8k/main/{train,test}.jsonl`` (a ``main`` subset, as GSM8K itself has, so
  ``DatasetMeta(..., subset_name='main')`` works): arithmetic word problems made from the
  templates below with a seeded RNG, as ``{"question", "answer"}`` rows whose answer is
  step-by-step reasoning with ``<<expr=value>>`` calculator notes and a final
  ``#### value`` line; every intermediate value is a whole number;
- ``countdown/{train,test}.jsonl``: ``{"nums", "target"}`` rows, the target made
  by combining all the numbers with + - * / (exact division, positive
  intermediates), so each target is reachable using every number once.

Usage: python build_bundled_datasets.py [OUTPUT_FOLDER]
(default: the package's ``twinkle/hub/bundled/datasets``).
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent
DEFAULT_OUTPUT = HERE.parent / "src/twinkle/hub/bundled/datasets"
SELF_COGNITION_SOURCE = HERE / "self_cognition.txt"

GSM8K_SIZES = {"train": 500, "test": 100}
COUNTDOWN_SIZES = {"train": 500, "test": 100}
GSM8K_SEED = 8
COUNTDOWN_SEED = 24
COUNTDOWN_TARGETS = (10, 200)

PEOPLE = [
    ("Mia", "she"),
    ("Leo", "he"),
    ("Ava", "she"),
    ("Noah", "he"),
    ("Lin", "she"),
    ("Ravi", "he"),
    ("Sofia", "she"),
    ("Omar", "he"),
    ("Hana", "she"),
    ("Tom", "he"),
    ("Zara", "she"),
    ("Kenji", "he"),
    ("Elena", "she"),
    ("Jamal", "he"),
    ("Yuki", "she"),
    ("Pablo", "he"),
]
ITEMS = ["pencils", "stickers", "cookies", "marbles", "cards", "balloons", "shells", "buttons"]
GOODS = [
    ("lamp", "lamps"),
    ("backpack", "backpacks"),
    ("jacket", "jackets"),
    ("board game", "board games"),
    ("toaster", "toasters"),
    ("kite", "kites"),
]
PLANTS = ["tomatoes", "carrots", "sunflowers", "lettuces", "beans", "peppers"]
VEHICLES = ["train", "bus", "car", "ship", "truck"]
FRACTIONS = [(1, 2), (1, 3), (2, 3), (1, 4), (3, 4), (2, 5), (3, 5)]


def step(expr: str, value: int) -> str:
    """``expr = <<expr=value>>value``: a calculation with its GSM8K calculator note."""
    return f"{expr} = <<{expr}={value}>>{value}"


def answer(lines: list[str], result: int) -> str:
    return "\n".join(lines) + f"\n#### {result}"


def _packs(rng: random.Random) -> tuple[str, str]:
    (name, he), item = rng.choice(PEOPLE), rng.choice(ITEMS)
    packs, per = rng.randint(2, 9), rng.randint(3, 12)
    total = packs * per
    given = rng.randint(1, total - 1)
    question = (
        f"{name} buys {packs} packs of {item}. Each pack holds {per} {item}. "
        f"{he.capitalize()} gives {given} {item} to a friend. "
        f"How many {item} does {name} have now?"
    )
    lines = [
        f"{name} buys {step(f'{packs}*{per}', total)} {item}.",
        f"{he.capitalize()} has {step(f'{total}-{given}', total - given)} {item} left.",
    ]
    return question, answer(lines, total - given)


def _wage(rng: random.Random) -> tuple[str, str]:
    name, he = rng.choice(PEOPLE)
    rate, hours, days = rng.randint(8, 30), rng.randint(2, 8), rng.randint(3, 6)
    daily = rate * hours
    question = (
        f"{name} earns ${rate} an hour. {he.capitalize()} works {hours} hours a day "
        f"for {days} days. How many dollars does {name} earn in total?"
    )
    lines = [
        f"Each day {name} earns {step(f'{rate}*{hours}', daily)} dollars.",
        f"In {days} days {he} earns {step(f'{daily}*{days}', daily * days)} dollars.",
    ]
    return question, answer(lines, daily * days)


def _half_as_many(rng: random.Random) -> tuple[str, str]:
    (name, he), item = rng.choice(PEOPLE), rng.choice(ITEMS)
    april = 2 * rng.randint(10, 60)
    may = april // 2
    question = (
        f"{name} sold {april} {item} in April and half as many in May. "
        f"How many {item} did {name} sell in April and May together?"
    )
    lines = [
        f"In May {name} sold {step(f'{april}/2', may)} {item}.",
        f"Together {he} sold {step(f'{april}+{may}', april + may)} {item}.",
    ]
    return question, answer(lines, april + may)


def _discount(rng: random.Random) -> tuple[str, str]:
    thing, things = rng.choice(GOODS)
    price, percent, count = 20 * rng.randint(2, 20), rng.choice([10, 20, 25, 50]), rng.randint(2, 5)
    off = price * percent // 100
    sale = price - off
    question = (
        f"A {thing} costs ${price}. This week it is {percent}% off. "
        f"How many dollars do {count} {things} cost this week?"
    )
    lines = [
        f"The discount is {step(f'{price}*{percent}/100', off)} dollars.",
        f"One {thing} now costs {step(f'{price}-{off}', sale)} dollars.",
        f"{count} {things} cost {step(f'{sale}*{count}', sale * count)} dollars.",
    ]
    return question, answer(lines, sale * count)


def _trip(rng: random.Random) -> tuple[str, str]:
    vehicle = rng.choice(VEHICLES)
    v1, h1, v2, h2 = rng.randint(40, 90), rng.randint(2, 5), rng.randint(30, 80), rng.randint(1, 4)
    d1, d2 = v1 * h1, v2 * h2
    question = (
        f"A {vehicle} travels at {v1} km per hour for {h1} hours, then at {v2} km per hour "
        f"for {h2} hours. How many kilometers does it travel in total?"
    )
    lines = [
        f"The first part is {step(f'{v1}*{h1}', d1)} km.",
        f"The second part is {step(f'{v2}*{h2}', d2)} km.",
        f"In total it travels {step(f'{d1}+{d2}', d1 + d2)} km.",
    ]
    return question, answer(lines, d1 + d2)


def _share(rng: random.Random) -> tuple[str, str]:
    (name, he), item = rng.choice(PEOPLE), rng.choice(ITEMS)
    friends, each = rng.randint(2, 8), rng.randint(3, 15)
    total = friends * each
    found = rng.randint(1, total - 1)
    had = total - found
    question = (
        f"{name} has {had} {item} and finds {found} more. {he.capitalize()} shares all of "
        f"them equally among {friends} friends. How many {item} does each friend get?"
    )
    lines = [
        f"{name} has {step(f'{had}+{found}', total)} {item}.",
        f"Each friend gets {step(f'{total}/{friends}', each)} {item}.",
    ]
    return question, answer(lines, each)


def _ages(rng: random.Random) -> tuple[str, str]:
    (young, _), (old, _) = rng.sample(PEOPLE, 2)
    age, times, years = rng.randint(4, 15), rng.randint(2, 4), rng.randint(2, 10)
    now = age * times
    question = (
        f"{young} is {age} years old. {old} is {times} times as old as {young}. "
        f"How old will {old} be in {years} years?"
    )
    lines = [
        f"{old} is {step(f'{age}*{times}', now)} years old now.",
        f"In {years} years {old} will be {step(f'{now}+{years}', now + years)} years old.",
    ]
    return question, answer(lines, now + years)


def _pages(rng: random.Random) -> tuple[str, str]:
    name, _ = rng.choice(PEOPLE)
    per_day, days = rng.randint(8, 30), rng.randint(3, 9)
    read = per_day * days
    pages = read + rng.randint(10, 200)
    question = (
        f"A book has {pages} pages. {name} reads {per_day} pages every day. "
        f"How many pages are left after {days} days?"
    )
    lines = [
        f"In {days} days {name} reads {step(f'{per_day}*{days}', read)} pages.",
        f"{step(f'{pages}-{read}', pages - read)} pages are left.",
    ]
    return question, answer(lines, pages - read)


def _garden(rng: random.Random) -> tuple[str, str]:
    (name, _), plant = rng.choice(PEOPLE), rng.choice(PLANTS)
    rows, per_row = rng.randint(3, 12), rng.randint(4, 15)
    planted = rows * per_row
    lost = rng.randint(1, planted // 3)
    question = (
        f"{name} plants {rows} rows of {plant} with {per_row} plants in each row. "
        f"{lost} of the plants do not grow. How many plants grow?"
    )
    lines = [
        f"{name} plants {step(f'{rows}*{per_row}', planted)} plants.",
        f"{step(f'{planted}-{lost}', planted - lost)} plants grow.",
    ]
    return question, answer(lines, planted - lost)


def _savings(rng: random.Random) -> tuple[str, str]:
    (name, he), (thing, _) = rng.choice(PEOPLE), rng.choice(GOODS)
    weekly, weeks, saved = rng.randint(5, 25), rng.randint(3, 12), rng.randint(10, 100)
    price = saved + weekly * weeks
    missing = price - saved
    question = (
        f"{name} wants a {thing} that costs ${price}. {he.capitalize()} already has ${saved} "
        f"and saves ${weekly} every week. How many weeks does {name} need to save?"
    )
    lines = [
        f"{name} still needs {step(f'{price}-{saved}', missing)} dollars.",
        f"That takes {step(f'{missing}/{weekly}', weeks)} weeks.",
    ]
    return question, answer(lines, weeks)


def _change(rng: random.Random) -> tuple[str, str]:
    name, he = rng.choice(PEOPLE)
    books, book_price = rng.randint(2, 6), rng.randint(2, 9)
    pens, pen_price = rng.randint(2, 8), rng.randint(1, 4)
    books_cost, pens_cost = books * book_price, pens * pen_price
    total = books_cost + pens_cost
    bill = next(b for b in (20, 50, 100) if b > total)
    question = (
        f"{name} buys {books} notebooks for ${book_price} each and {pens} pens for "
        f"${pen_price} each. {he.capitalize()} pays with a ${bill} bill. "
        f"How many dollars of change does {name} get?"
    )
    lines = [
        f"The notebooks cost {step(f'{books}*{book_price}', books_cost)} dollars.",
        f"The pens cost {step(f'{pens}*{pen_price}', pens_cost)} dollars.",
        f"Together they cost {step(f'{books_cost}+{pens_cost}', total)} dollars.",
        f"The change is {step(f'{bill}-{total}', bill - total)} dollars.",
    ]
    return question, answer(lines, bill - total)


def _class_fraction(rng: random.Random) -> tuple[str, str]:
    num, den = rng.choice(FRACTIONS)
    students = den * rng.randint(4, 10)
    walk = students * num // den
    question = (
        f"There are {students} students in a class. {num}/{den} of them walk to school and "
        f"the rest take the bus. How many students take the bus?"
    )
    lines = [
        f"{step(f'{students}*{num}/{den}', walk)} students walk.",
        f"{step(f'{students}-{walk}', students - walk)} students take the bus.",
    ]
    return question, answer(lines, students - walk)


GSM8K_TEMPLATES: list[Callable[[random.Random], tuple[str, str]]] = [
    _packs,
    _wage,
    _half_as_many,
    _discount,
    _trip,
    _share,
    _ages,
    _pages,
    _garden,
    _savings,
    _change,
    _class_fraction,
]


def self_cognition_rows(source: Path = SELF_COGNITION_SOURCE) -> list[dict]:
    """The pairs of ``source``, alternating Chinese and English rows."""
    pairs: dict[str, list[dict]] = {}
    tag, query = None, None
    for number, raw in enumerate(source.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line in ("[zh]", "[en]"):
            tag = line[1:-1]
            pairs[tag] = []
        elif line.startswith("Q: ") and tag and query is None:
            query = line[3:]
        elif line.startswith("A: ") and tag and query is not None:
            pairs[tag].append({"query": query, "response": line[3:], "tag": tag})
            query = None
        else:
            raise ValueError(f"{source}:{number}: expected [zh], [en], 'Q: ...' or 'A: ...'")
    zh, en = pairs.get("zh", []), pairs.get("en", [])
    rows = [row for pair in zip(zh, en, strict=False) for row in pair]
    return rows + zh[len(en) :] + en[len(zh) :]


def gsm8k_rows(count: int, seed: int = GSM8K_SEED) -> list[dict]:
    """``count`` distinct word problems from randomly chosen templates."""
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < count:
        question, solution = rng.choice(GSM8K_TEMPLATES)(rng)
        if question not in seen:
            seen.add(question)
            rows.append({"question": question, "answer": solution})
    return rows


def countdown_row(rng: random.Random) -> dict:
    """3 or 4 numbers in 1..99 and a target in COUNTDOWN_TARGETS made from all of them."""
    low, high = COUNTDOWN_TARGETS
    while True:
        nums = [rng.randint(1, 99) for _ in range(rng.choice([3, 4]))]
        values = list(nums)
        while len(values) > 1:
            a, b = (values.pop(rng.randrange(len(values))) for _ in range(2))
            a, b = max(a, b), min(a, b)
            options = [a + b, a * b] + ([a - b] if a > b else []) + ([a // b] if a % b == 0 else [])
            values.append(rng.choice(options))
        if low <= values[0] <= high:
            return {"nums": nums, "target": values[0]}


def countdown_rows(count: int, seed: int = COUNTDOWN_SEED) -> list[dict]:
    """``count`` distinct Countdown problems."""
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < count:
        row = countdown_row(rng)
        key = (tuple(sorted(row["nums"])), row["target"])
        if key not in seen:
            seen.add(key)
            rows.append(row)
    return rows


def split(rows: list[dict], sizes: dict[str, int]) -> dict[str, list[dict]]:
    out, start = {}, 0
    for name, size in sizes.items():
        out[name] = rows[start : start + size]
        start += size
    return out


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    path.write_bytes(text.encode("utf-8"))


def build(output: Path) -> None:
    """Write every bundled dataset under ``output`` (one folder per dataset)."""
    write_jsonl(output / "self-cognition" / "train.jsonl", self_cognition_rows())
    gsm8k = split(gsm8k_rows(sum(GSM8K_SIZES.values())), GSM8K_SIZES)
    countdown = split(countdown_rows(sum(COUNTDOWN_SIZES.values())), COUNTDOWN_SIZES)
    for folder, splits in (("gsm8k/main", gsm8k), ("countdown", countdown)):
        for split_name, rows in splits.items():
            write_jsonl(output / folder / f"{split_name}.jsonl", rows)


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUTPUT)
