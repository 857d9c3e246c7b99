"""Container bytes a donor at N donors: the structures removed vs their replacements (sys.getsizeof, CPython)."""

import sys
from array import array

for n in (100_000, 1_000_000):
    ids = [f"w{i % 64}-donor-{i:08d}" for i in range(n)]
    keys = list(range(n))
    d_ids = {k: s for k, s in zip(keys, ids, strict=True)}
    d_ns = {k: "n" * 16 for k in keys}
    fed = set()
    for s in ids:
        fed.add(s)
    lst = [None] * 0
    for s in ids:
        lst.append(s)
    codes = array("I")
    codes.frombytes(bytes(4 * n))
    old = sys.getsizeof(d_ids) + sys.getsizeof(d_ns) + sys.getsizeof(fed)
    new = sys.getsizeof(lst) + sys.getsizeof(codes)
    print(
        f"n={n}: _ids dict {sys.getsizeof(d_ids) / n:.1f} + _key_namespace dict {sys.getsizeof(d_ns) / n:.1f} + _fed set "
        f"{sys.getsizeof(fed) / n:.1f} = {old / n:.1f} B a donor; list {sys.getsizeof(lst) / n:.1f} + array {sys.getsizeof(codes) / n:.1f}"
        f" = {new / n:.1f}; saved {(old - new) / n:.1f} B a donor"
    )
