"""README's table of kernel families states each family's accepted configs on sm_90; a change of
a space (a constraint, a parameter's values) must change the table with it."""
from __future__ import annotations

import re
from pathlib import Path

import kernels

README = Path(__file__).resolve().parents[1] / "README.md"
ROW = re.compile(r"^\| \d+ \| `(\w+)` \|.*\| ([\d,]+) \|$")


def test_every_family_row_states_its_accepted_count():
    stated = {m.group(1): int(m.group(2).replace(",", ""))
              for line in README.read_text().splitlines() if (m := ROW.match(line))}
    assert set(stated) == set(kernels.FAMILIES)
    actual = {name: len(kernels.get_family(name).accepted_configs("sm_90")) for name in stated}
    assert stated == actual
