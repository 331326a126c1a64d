#!/usr/bin/python3
"""Expected results of ctuner's TOML reader (src/config/toml.c), from Python's
own tomllib (3.11+), for the fixtures in tests/data/toml:

  valid/*.toml    tomllib reads them: writes valid/NAME.json, the value tree in
                  toml-test's tagged form ({"type": "integer", "value": "42"};
                  floats as repr, inf/nan spelled so) that tests/test_config_toml.c
                  compares with what ctuner reads;
  invalid/*.toml  tomllib refuses them: ctuner must too (checked here);
  refused/*.toml  tomllib reads them but ctuner refuses them by name (tables,
                  dates, ...): checked here that tomllib does read them, and
                  their first line says '# refused: WHAT', the words ctuner's
                  message must hold.

Run: /usr/bin/python3 scripts/toml_expect.py [--check]   (--check: compare
with the committed .json files instead of writing them; exit 1 on a difference).
Offline, standard library only.
"""
import json
import math
import pathlib
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "toml"


def tag(v):
    if isinstance(v, bool):
        return {"type": "bool", "value": "true" if v else "false"}
    if isinstance(v, int):
        return {"type": "integer", "value": str(v)}
    if isinstance(v, float):
        if math.isnan(v):
            s = "nan"
        elif math.isinf(v):
            s = "inf" if v > 0 else "-inf"
        else:
            s = repr(v)
        return {"type": "float", "value": s}
    if isinstance(v, str):
        return {"type": "string", "value": v}
    if isinstance(v, list):
        return [tag(x) for x in v]
    if isinstance(v, dict):
        return {k: tag(x) for k, x in v.items()}
    raise TypeError(type(v))


def main():
    check = "--check" in sys.argv[1:]
    bad = 0
    for f in sorted((ROOT / "valid").glob("*.toml")):
        text = json.dumps(tag(tomllib.loads(f.read_bytes().decode("utf-8"))), indent=1,
                          ensure_ascii=True, sort_keys=False) + "\n"
        out = f.with_suffix(".json")
        if check:
            if not out.exists() or out.read_text() != text:
                print(f"differs: {out}")
                bad += 1
        else:
            out.write_text(text)
    for f in sorted((ROOT / "invalid").glob("*.toml")):
        try:
            tomllib.loads(f.read_bytes().decode("utf-8"))
            print(f"tomllib reads {f}, which should be invalid")
            bad += 1
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            pass
    for f in sorted((ROOT / "refused").glob("*.toml")):
        first = f.read_text().splitlines()[0]
        if not first.startswith("# refused: "):
            print(f"{f}: first line must be '# refused: WHAT'")
            bad += 1
        try:
            tomllib.loads(f.read_text())
        except tomllib.TOMLDecodeError as e:
            print(f"tomllib refuses {f} ({e}); it belongs in invalid/")
            bad += 1
    n = sum(1 for _ in ROOT.glob("*/*.toml"))
    print(f"{n} fixtures, {bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
