"""What the STAND-INS of molecule/standins share (tests only; none of them is the real program): Go flag syntax,
durations, logfmt logging, the configuration file (yaml.safe_load: python3-yaml is in the test images) and the strict
decoding that Loki and Promtail do (Go yaml.v2 UnmarshalStrict into their config structs), with its wording:
"field X not found in type T", "cannot unmarshal !!str `x` into int"."""
import json
import os
import re
import sys

import yaml

LOG = {"level": "info"}
_LEVELS = {"debug": 0, "info": 1, "warn": 2, "error": 3}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d|w|y)")
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800,
          "y": 31536000}
_TAGS = {bool: "!!bool", int: "!!int", float: "!!float", str: "!!str"}
_GO = {"s": "string", "i": "int", "f": "float64", "b": "bool", "d": "time.Duration", "l": "[]string"}
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def log(level, msg, **fields):
    if _LEVELS.get(level, 1) >= _LEVELS.get(LOG["level"], 1):
        extra = "".join(" %s=%s" % (k, json.dumps(v) if isinstance(v, str) else v) for k, v in fields.items())
        sys.stderr.write("level=%s caller=standin msg=%s%s\n" % (level, json.dumps(msg), extra))
        sys.stderr.flush()


def duration(value, what="duration"):
    """Seconds of a Go/Prometheus duration ("10m", "1h30m", "744h", "31d"); a bare 0 is accepted."""
    if value in (0, "0"):
        return 0.0
    if not isinstance(value, str) or not value or _DURATION.sub("", value):
        raise ValueError("%s: time: invalid duration %s" % (what, json.dumps(value)))
    return sum(float(number) * _UNITS[unit] for number, unit in _DURATION.findall(value))


def flags(argv, spec, name):
    """Go's flag package: -name, --name, -name=value, -name value; booleans take only the = form; exit 2 on misuse."""
    values = {key: default for key, (kind, default) in spec.items()}
    args = list(argv)
    while args:
        arg = args.pop(0)
        key, eq, value = arg.lstrip("-").partition("=")
        problem = None
        if not arg.startswith("-") or arg in ("-", "--"):
            problem = "unexpected argument %r" % arg
        elif key not in spec:
            problem = "flag provided but not defined: -%s" % key
        elif spec[key][0] is bool:
            if eq and value.lower() not in ("true", "false", "1", "0", "t", "f"):
                problem = "invalid boolean value %r for flag -%s" % (value, key)
            values[key] = value.lower() in ("true", "1", "t") if eq else True
        elif eq or args:
            values[key] = value if eq else args.pop(0)
        else:
            problem = "flag needs an argument: -%s" % key
        if problem:
            sys.stderr.write("%s\nUsage of %s (hpcobs STAND-IN): %s\n" % (problem, name, " ".join(sorted(spec))))
            sys.exit(2)
    return values


def load_config(path, expand_env=False):
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as err:
        raise ValueError("cannot read config file %s: %s" % (path, err.strerror)) from err
    if expand_env:
        text = re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: os.environ.get(m.group(1), m.group(2) or ""), text)
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError("%s: %s" % (path, " ".join(str(err).split()))) from err
    if not isinstance(config if config is not None else {}, dict):
        raise ValueError("%s: the configuration must be a YAML mapping" % path)
    return config or {}


def section(config, *path):
    for key in path:
        config = config.get(key) if isinstance(config, dict) else None
    return config if isinstance(config, dict) else {}


def decode(errors, value, spec, type_name, blocks, names=None):
    """Strict decoding of value into spec, a {key: kind} table. Kinds: s i f b d l (string, int, float, bool,
    duration, list of strings), * (anything), "<block>" / "[<block>]" (a block of blocks, or a list of them; a block
    missing from blocks is not checked), or a dict (an inline block). names: the Go type name of each block."""
    if value is None:
        return
    if not isinstance(value, dict):
        errors.append("cannot unmarshal %s `%s` into %s" % (_tag(value), value, type_name))
        return
    for key, item in value.items():
        if key not in spec:
            errors.append("field %s not found in type %s" % (key, type_name))
        else:
            _decode_value(errors, item, spec[key], "%s.%s" % (type_name, key), blocks, names or {})


def _tag(value):
    return _TAGS.get(type(value), "!!map" if isinstance(value, dict) else "!!seq")


def _decode_value(errors, item, kind, where, blocks, names):
    if item is None or kind == "*":
        return
    if isinstance(kind, dict):
        decode(errors, item, kind, where, blocks, names)
    elif kind.startswith("[<"):
        if not isinstance(item, list):
            errors.append("cannot unmarshal %s into []%s" % (_tag(item), kind[2:-2]))
        for element in item if isinstance(item, list) else []:
            _decode_value(errors, element, kind[1:-1], where, blocks, names)
    elif kind.startswith("<"):
        if kind[1:-1] in blocks:
            decode(errors, item, blocks[kind[1:-1]], names.get(kind[1:-1], kind[1:-1]), blocks, names)
    elif kind == "d" and isinstance(item, str):
        try:
            duration(item, where)
        except ValueError as err:
            errors.append(str(err))
    elif {"s": isinstance(item, (dict, list)), "i": not isinstance(item, int) or isinstance(item, bool),
          "f": not isinstance(item, (int, float)) or isinstance(item, bool), "b": not isinstance(item, bool),
          "d": not isinstance(item, int) or isinstance(item, bool), "l": isinstance(item, dict)}[kind]:
        errors.append("cannot unmarshal %s `%s` into %s" % (_tag(item), item, _GO[kind]))
