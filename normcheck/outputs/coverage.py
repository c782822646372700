"""What a default sweep covers (`normcheck list --op OP --coverage`): every factor value and every pair of
values of two factors, with how many cases cover it, read off the cases; the excluded pairs with why."""
from __future__ import annotations

from ..cases.narrowing import Narrowing
from ..cases.sweep import coverage, default_sweep, narrowed_design


def coverage_document(op: str, narrowing: Narrowing = Narrowing()) -> dict:
    """What the op's sweep covers, narrowed as the run's options say."""
    cases = default_sweep(op, narrowing=narrowing)
    values, pairs = coverage(op, cases, narrowing)
    narrowed, excluded = narrowed_design(op, narrowing)
    fs = {f.name: f for f in narrowed}
    missing = [f"{name}={fs[name].show(v)}" for name, counts in values.items() for v, n in counts.items() if not n]
    missing += [f"{a}={fs[a].show(va)} × {b}={fs[b].show(vb)}" for (a, b), counts in pairs.items()
                for (va, vb), n in counts.items() if not n]
    return {
        "op": op, "cases": len(cases), "distinct_shapes": len({c.shape for c in cases}),
        "factors": [{"name": f.name, "values": [{"value": f.show(lv.value), "why": lv.why, "cases": values[f.name][lv.value]}
                                                for lv in f.levels]} for f in fs.values()],
        "pairs": [{"factors": [a, b], "covered": sum(1 for n in counts.values() if n), "allowed": len(counts),
                   "least": min(counts.values(), default=0),
                   "counts": {f"{fs[a].show(va)} × {fs[b].show(vb)}": n for (va, vb), n in counts.items()}}
                  for (a, b), counts in pairs.items()],
        "excluded": [{"factors": list(e.factors), "why": e.why} for e in excluded],
        "missing": missing,
    }


def coverage_text(doc: dict) -> str:
    pairs = sum(p["allowed"] for p in doc["pairs"])
    verdict = "every value and every allowed pair covered" if not doc["missing"] else \
        f"{len(doc['missing'])} NOT COVERED: {', '.join(doc['missing'][:5])}"
    lines = [f"{doc['op']}: {doc['cases']} cases ({doc['distinct_shapes']} shapes) over {len(doc['factors'])} factors, "
             f"{sum(len(f['values']) for f in doc['factors'])} values, {pairs} allowed pairs of values: {verdict}",
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
    return "\n".join(lines)

