"""What a default sweep covers (`normcheck list --op OP --coverage`): every factor value and every pair of
values of two factors, with how many of the covering design's cases cover it, read off the cases; the excluded pairs
with why; the triples of the classes kernels choose paths by that the cases hold; then the boundary scans, a block of
their own (each scanned size factor's sizes)."""
from __future__ import annotations

from dataclasses import replace

from ..ops import Op
from ..cases.narrowing import Narrowing
from ..cases.sweep import case_of, class_triples, coverage, default_sweep, narrowed_design, scan_rows, triple_cases
from ..ops.design import SCAN_MULTIPLES


def coverage_document(op: Op, narrowing: Narrowing = Narrowing()) -> dict:
    """What the op's sweep covers, narrowed as the run's options say."""
    cases = default_sweep(op, narrowing=replace(narrowing, scans="without")) if narrowing.scans != "only" else []
    values, pairs = coverage(op, cases, narrowing)
    narrowed, excluded = narrowed_design(op, narrowing)
    fs = {f.name: f for f in narrowed}
    missing = [f"{name}={fs[name].show(v)}" for name, counts in values.items() for v, n in counts.items() if not n]
    missing += [f"{a}={fs[a].show(va)} × {b}={fs[b].show(vb)}" for (a, b), counts in pairs.items()
                for (va, vb), n in counts.items() if not n]
    return {
        "op": op.name, "cases": len(cases), "distinct_shapes": len({c.shape for c in cases}),
        "factors": [{"name": f.name, "values": [{"value": f.show(lv.value), "why": lv.why, "cases": values[f.name][lv.value]}
                                                for lv in f.levels]} for f in fs.values()],
        "pairs": [{"factors": [a, b], "covered": sum(1 for n in counts.values() if n), "allowed": len(counts),
                   "least": min(counts.values(), default=0),
                   "counts": {f"{fs[a].show(va)} × {fs[b].show(vb)}": n for (va, vb), n in counts.items()}}
                  for (a, b), counts in pairs.items()],
        "excluded": [{"factors": list(e.factors), "why": e.why} for e in excluded],
        "missing": missing,
        "triples": triples_document(op, narrowing, cases),
        "scans": scans_document(op, narrowing, cases) if narrowing.scans != "without" else [],
    }


def triples_document(op: Op, narrowing: Narrowing, cases) -> dict:
    """How many cases the class triples add, and the triples of classes the cases hold of those there are."""
    held, total = class_triples(op, cases, narrowing)
    return {"cases": len(triple_cases(op, narrowing)) if cases else 0, "held": held, "triples": total}


def scans_document(op: Op, narrowing: Narrowing, design) -> list[dict]:
    """The boundary scans: per scanned factor, the sizes its cases have and in which dtypes, and how many cases they
    add to the covering design's (`design`: a case two scans or the design share counts once)."""
    by_factor: dict[str, dict] = {}
    seen = set(design)
    for name, size, row in scan_rows(op, replace(narrowing, scans="with")):
        case = case_of(op, row, 0, narrowing)
        scan = by_factor.setdefault(name, {"factor": name, "sizes": [], "dtypes": [], "cases": 0})
        scan["cases"] += case not in seen
        seen.add(case)
        if size not in scan["sizes"]:
            scan["sizes"].append(size)
        dtype = "/".join(dict.fromkeys(row["dtype"]))
        if dtype not in scan["dtypes"]:
            scan["dtypes"].append(dtype)
    return list(by_factor.values())


def coverage_text(doc: dict) -> str:
    pairs = sum(p["allowed"] for p in doc["pairs"])
    verdict = "every value and every allowed pair covered" if not doc["missing"] else \
        f"{len(doc['missing'])} NOT COVERED: {', '.join(doc['missing'][:5])}"
    scanned = sum(s["cases"] for s in doc["scans"])
    lines = [f"{doc['op']}: {doc['cases']} cases ({doc['distinct_shapes']} shapes) over {len(doc['factors'])} factors, "
             f"{sum(len(f['values']) for f in doc['factors'])} values, {pairs} allowed pairs of values: {verdict}; "
             f"{scanned} boundary-scan cases besides",
             "values (cases covering each):"]
    for f in doc["factors"]:
        lines.append(f"  {f['name']}")
        lines += [f"    {v['value']:<28} {v['cases']:>4}  {v['why']}" for v in f["values"]]
    lines.append("pairs (cases covering each pair of values):")
    for p in doc["pairs"]:
        a, b = p["factors"]
        lines.append(f"  {a} × {b}: {p['covered']} of {p['allowed']} covered, each by at least {p['least']}")
        lines.append("    " + ", ".join(f"{k} {n}" for k, n in p["counts"].items()))
    lines.append("excluded pairs:")
    lines += [f"  {' × '.join(e['factors'])}: {e['why']}" for e in doc["excluded"]]
    triples = doc["triples"]
    lines.append(f"class triples ({triples['cases']} of the cases: the classes of dtype, layout, path and mode, and the "
                 f"innermost extent's remainder by 16, 8, 4, 2): {triples['held']} of {triples['triples']} triples held")
    if not doc["scans"]:
        lines.append("boundary scans: none")
    else:
        multiples = ", ".join(map(str, SCAN_MULTIPLES))
        lines.append(f"boundary scans ({scanned} cases: one size factor at a time through k·2^j − 1, k·2^j, "
                     f"k·2^j + 1 for k = {multiples}, each other factor at its usual level; contiguous, normal data):")
    for scan in doc["scans"]:
        lines.append(f"  {scan['factor']}: {len(scan['sizes'])} sizes in {', '.join(scan['dtypes'])} "
                     f"({scan['cases']} cases)")
        lines.append("    " + " ".join(map(str, scan["sizes"])))
    return "\n".join(lines)

