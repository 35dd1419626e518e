"""A strict LogQL parser and the loki role's rule checks (filters `loki_rule_problems`, `loki_logql_kind`).

Why: Loki's ruler reads all rule files of a tenant in one go. One expression it cannot parse makes it load ZERO rule
groups of that tenant (`unable to list rules ... could not parse expression`), the shipped XID group included, and an
alert written as a log query loads but errors at every evaluation ("rule result is not a vector or scalar"). So the
role parses every expression here, on the controller, and refuses the whole rule set before anything changes.

The grammar follows the LogQL of Loki 3.x (docs/sources/query/ of grafana/loki, pkg/logql/syntax): stream selectors,
line filters (|= != |~ !~ |> !>, `or` chains, ip()), parsers (json, logfmt, regexp, pattern, unpack), label filters
(string, number, duration, bytes, ip; and/or/comma/implicit and, parentheses), line_format, label_format, drop, keep,
decolorize, unwrap (bytes()/duration()/duration_seconds()), range aggregations with offset, vector aggregations with
by/without, topk/bottomk/sort, binary operators with bool, on/ignoring and group_left/group_right, number literals,
vector() and label_replace(). Regular expressions must compile and may not use what RE2 lacks (look-around,
back-references). Anything outside this grammar is an error: stricter than Loki at worst, never looser.

This file is shared: molecule/standins/build-test-bundle.py packs it into the Loki stand-in, which loads its rule
files with it the way the real ruler does.
"""

from __future__ import annotations

import json
import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # used outside Ansible (unit tests, the Loki stand-in)
    AnsibleFilterError = ValueError

RANGE_OPS = {"count_over_time", "rate", "bytes_over_time", "bytes_rate", "absent_over_time", "sum_over_time",
             "avg_over_time", "max_over_time", "min_over_time", "stdvar_over_time", "stddev_over_time",
             "quantile_over_time", "first_over_time", "last_over_time", "rate_counter"}
# range aggregations that need "| unwrap <label>", and those that must not have it (rate and absent_over_time
# take both); which ones may be grouped (by/without). As RangeAggregationExpr.validate of pkg/logql/syntax (3.7).
UNWRAP_REFUSED = {"count_over_time", "bytes_over_time", "bytes_rate"}
UNWRAP_REQUIRED = RANGE_OPS - UNWRAP_REFUSED - {"rate", "absent_over_time"}
GROUPABLE_RANGE = {"avg_over_time", "stddev_over_time", "stdvar_over_time", "quantile_over_time", "max_over_time",
                   "min_over_time", "first_over_time", "last_over_time"}
VECTOR_OPS = {"sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "sort", "sort_desc"}
BIN_PRECEDENCE = [{"or"}, {"and", "unless"}, {"==", "!=", ">", ">=", "<", "<="}, {"+", "-"}, {"*", "/", "%"}, {"^"}]
COMPARISONS = {"==", "!=", ">", ">=", "<", "<="}
KEYWORDS = {"by", "without", "bool", "on", "ignoring", "group_left", "group_right", "offset", "and", "or", "unless"}
LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DURATION = r"(?:\d+(?:\.\d+)?(?:ns|us|µs|ms|s|m|h|d|w|y))+"
_BYTES = r"\d+(?:\.\d+)?(?:[KMGTPE]i?B|B|[kmgtpe]i?b|b)"
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|`[^`]*`)
  | (?P<duration>%s)(?![\w.])
  | (?P<bytes>%s)(?![\w.])
  | (?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(?![\w.])
  | (?P<ident>[a-zA-Z_][a-zA-Z0-9_]*)
  | (?P<op>\|=|\|~|\|>|!>|!=|!~|=~|==|>=|<=|\||[{}()\[\],=<>+\-*/%%^])
""" % (_DURATION, _BYTES), re.VERBOSE)


class LogQLError(ValueError):
    """An expression Loki would refuse (message in Loki's "parse error at line 1, col N: ..." style)."""


def _tokens(text):
    tokens, pos = [], 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise LogQLError("parse error at line 1, col %d: syntax error: unexpected character %r"
                             % (pos + 1, text[pos]))
        kind = match.lastgroup
        if kind not in ("ws", "comment"):
            tokens.append((kind, match.group(), pos + 1))
        pos = match.end()
    tokens.append(("eof", "", len(text) + 1))
    return tokens


def _string_value(token):
    text = token[1]
    if text.startswith("`"):
        return text[1:-1]
    try:
        return json.loads(text)
    except ValueError:
        # Go escapes JSON lacks (\a, \v, \x41, octal) would still be fine in Go; refuse them to stay strict
        raise LogQLError("parse error at line 1, col %d: invalid string %s" % (token[2], text)) from None


_RE2_UNSUPPORTED = re.compile(r"\(\?[=!]|\(\?<[=!]|\\[1-9]|\(\?P=")


def check_regex(pattern, where):
    """A regular expression as Go's RE2 takes it (approximated by Python's re plus RE2's omissions)."""
    if _RE2_UNSUPPORTED.search(pattern):
        raise LogQLError("%s: invalid regex %r: look-around and back-references are not supported (RE2)"
                         % (where, pattern))
    try:
        return re.compile(pattern)
    except re.error as err:
        raise LogQLError("%s: invalid regex %r: %s" % (where, pattern, err)) from None


class _Parser:
    def __init__(self, text):
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    # -- token helpers
    def peek(self, offset=0):
        return self.tokens[min(self.pos + offset, len(self.tokens) - 1)]

    def next(self):
        token = self.peek()
        self.pos += 1
        return token

    def error(self, token=None, expected=None):
        token = token or self.peek()
        what = "end of input" if token[0] == "eof" else repr(token[1])
        msg = "parse error at line 1, col %d: syntax error: unexpected %s" % (token[2], what)
        if expected:
            msg += ", expecting %s" % expected
        return LogQLError(msg)

    def is_op(self, *values):
        token = self.peek()
        return token[0] == "op" and token[1] in values

    def is_word(self, *values):
        token = self.peek()
        return token[0] == "ident" and token[1] in values

    def expect_op(self, value):
        if not self.is_op(value):
            raise self.error(expected=repr(value))
        return self.next()

    def expect(self, kind, what):
        if self.peek()[0] != kind:
            raise self.error(expected=what)
        return self.next()

    def label_name(self):
        token = self.peek()
        if token[0] != "ident" or token[1] in KEYWORDS and token[1] not in ("by", "on"):
            raise self.error(expected="a label name")
        return self.next()[1]

    # -- entry
    def parse(self):
        if self.peek()[0] == "eof":
            raise LogQLError("parse error: empty expression")
        kind = self.expr(0)
        if self.peek()[0] != "eof":
            raise self.error()
        return kind

    # -- binary expressions (metric or literal operands; a log query cannot be an operand)
    def expr(self, level):
        if level == len(BIN_PRECEDENCE):
            return self.unary()
        left = self.expr(level + 1)
        while True:
            token = self.peek()
            op = token[1] if token[0] in ("op", "ident") else None
            if op not in BIN_PRECEDENCE[level]:
                return left
            self.next()
            if self.is_word("bool"):
                if op not in COMPARISONS:
                    raise self.error(expected="an expression")
                self.next()
            self.vector_matching(op)
            right = self.expr(level + 1) if op != "^" else self.expr(level)
            for side, kind in (("left", left), ("right", right)):
                if kind == "log":
                    raise LogQLError("parse error at line 1, col %d: a log query cannot be the %s side of %r: "
                                     "binary operations take metric queries or numbers" % (token[2], side, op))
            if op in ("and", "or", "unless") and "scalar" in (left, right):
                raise LogQLError("parse error at line 1, col %d: %r needs metric queries on both sides"
                                 % (token[2], op))
            left = "scalar" if left == right == "scalar" else "metric"

    def vector_matching(self, op):
        if self.is_word("on", "ignoring"):
            self.next()
            self.label_list()
            if self.is_word("group_left", "group_right"):
                if op in ("and", "or", "unless"):
                    raise self.error()
                self.next()
                if self.is_op("("):
                    self.label_list()

    def label_list(self):
        self.expect_op("(")
        names = []
        if not self.is_op(")"):
            names.append(self.label_name())
            while self.is_op(","):
                self.next()
                names.append(self.label_name())
        self.expect_op(")")
        return names

    def unary(self):
        if self.is_op("-", "+"):
            self.next()
            kind = self.unary()
            if kind == "log":
                raise self.error()
            return kind
        return self.primary()

    def primary(self):
        token = self.peek()
        if token[0] == "number":
            self.next()
            return "scalar"
        if token[0] == "op" and token[1] == "(":
            self.next()
            kind = self.expr(0)
            self.expect_op(")")
            return kind
        if token[0] == "op" and token[1] == "{":
            return self.log_query(in_range=False)
        if token[0] == "ident":
            name = token[1]
            if name in RANGE_OPS:
                return self.range_aggregation()
            if name in VECTOR_OPS:
                return self.vector_aggregation()
            if name == "vector":
                self.next()
                self.expect_op("(")
                self.expect("number", "a number")
                self.expect_op(")")
                return "metric"
            if name == "label_replace":
                return self.label_replace()
            raise LogQLError("parse error at line 1, col %d: syntax error: unexpected IDENTIFIER %r (not a LogQL "
                             "function, and a stream selector needs braces)" % (token[2], name))
        raise self.error(expected="an expression")

    def label_replace(self):
        self.next()
        self.expect_op("(")
        if self.expr(0) != "metric":
            raise LogQLError("parse error: label_replace needs a metric query as its first argument")
        args = []
        for _ in range(4):
            self.expect_op(",")
            args.append(_string_value(self.expect("string", "a string")))
        self.expect_op(")")
        if not LABEL.match(args[0]):
            raise LogQLError("parse error: label_replace: invalid destination label name %r" % args[0])
        check_regex(args[3], "label_replace")
        return "metric"

    def grouping(self):
        if self.is_word("by", "without"):
            self.next()
            self.label_list()
            return True
        return False

    def vector_aggregation(self):
        name = self.next()[1]
        grouped = self.grouping()
        self.expect_op("(")
        if name in ("topk", "bottomk"):
            self.expect("number", "the number of series of %s" % name)
            self.expect_op(",")
        if self.expr(0) != "metric":
            raise LogQLError("parse error: %s() aggregates metric queries: wrap a log query in a range aggregation "
                             "such as count_over_time(... [5m])" % name)
        self.expect_op(")")
        if self.grouping():
            if grouped:
                raise self.error()
            grouped = True
        if grouped and name in ("sort", "sort_desc"):
            raise LogQLError("parse error: %s does not take by/without" % name)
        return "metric"

    def range_aggregation(self):
        name_token = self.next()
        name = name_token[1]
        self.expect_op("(")
        if name == "quantile_over_time":
            self.expect("number", "the quantile")
            self.expect_op(",")
        unwrapped = self.log_range()
        self.expect_op(")")
        if name in UNWRAP_REQUIRED and not unwrapped:
            raise LogQLError("parse error at line 1, col %d: invalid aggregation %s without unwrap"
                             % (name_token[2], name))
        if name in UNWRAP_REFUSED and unwrapped:
            raise LogQLError("parse error at line 1, col %d: invalid aggregation %s with unwrap"
                             % (name_token[2], name))
        if self.grouping() and name not in GROUPABLE_RANGE:
            raise LogQLError("parse error at line 1, col %d: grouping not allowed for %s aggregation"
                             % (name_token[2], name))
        return "metric"

    def log_range(self):
        """A log query with its [range] (before or after the pipeline), optional offset. True when unwrapped."""
        if self.is_op("("):
            self.next()
            unwrapped = self.log_query(in_range=True)
            self.expect_op(")")
            self.range_selector()
            return unwrapped
        self.selector()
        if self.is_op("["):
            self.range_selector()
            return self.pipeline(in_range=True)
        unwrapped = self.pipeline(in_range=True)
        if not self.is_op("["):
            raise self.error(expected="a range such as [5m]")
        self.range_selector()
        return unwrapped

    def range_selector(self):
        self.expect_op("[")
        self.expect("duration", "a duration such as 5m")
        self.expect_op("]")
        if self.is_word("offset"):
            self.next()
            self.expect("duration", "a duration after offset")

    def log_query(self, in_range):
        self.selector()
        unwrapped = self.pipeline(in_range)
        if self.is_op("["):
            raise LogQLError("parse error at line 1, col %d: a range [..] belongs inside a range aggregation such "
                             "as count_over_time(...)" % self.peek()[2])
        return unwrapped if in_range else "log"

    # -- stream selector
    def selector(self):
        start = self.expect_op("{")
        matchers = []
        while not self.is_op("}"):
            name = self.label_name()
            op = self.peek()
            if not (op[0] == "op" and op[1] in ("=", "!=", "=~", "!~")):
                raise self.error(expected="=, !=, =~ or !~")
            self.next()
            value = _string_value(self.expect("string", "a quoted string"))
            if op[1] in ("=~", "!~"):
                check_regex(value, "stream selector")
            matchers.append((name, op[1], value))
            if self.is_op(","):
                self.next()
                if self.is_op("}"):
                    raise self.error(expected="a label matcher")
            elif not self.is_op("}"):
                raise self.error(expected="',' or '}'")
        self.next()
        if not any(self.non_empty(m) for m in matchers):
            raise LogQLError("parse error at line 1, col %d: queries require at least one regexp or equality "
                             "matcher that does not have an empty-compatible value. For instance, app=~\".*\" does "
                             "not meet this requirement, but app=~\".+\" will" % start[2])
        return matchers

    @staticmethod
    def non_empty(matcher):
        _, op, value = matcher
        if op == "=":
            return value != ""
        if op == "=~":
            return not re.fullmatch(value, "")
        return False

    # -- pipeline
    def pipeline(self, in_range):
        """Parse pipeline stages; True when it ends with unwrap (only allowed inside a range aggregation)."""
        unwrapped = False
        while True:
            if self.is_op("|=", "!=", "|~", "!~", "|>", "!>"):
                if unwrapped:
                    raise self.error()
                self.line_filter()
                continue
            if not self.is_op("|"):
                return unwrapped
            if unwrapped:
                raise self.error(expected="a range after unwrap")
            self.next()
            token = self.peek()
            word = token[1] if token[0] == "ident" else None
            if word == "unwrap":
                if not in_range:
                    raise LogQLError("parse error at line 1, col %d: unwrap is only allowed in a range aggregation"
                                     % token[2])
                self.unwrap()
                unwrapped = True
            elif word in ("json", "logfmt"):
                self.parser_stage(word)
            elif word in ("regexp", "pattern"):
                self.next()
                value = _string_value(self.expect("string", "the %s expression" % word))
                if word == "regexp":
                    pattern = check_regex(value, "regexp stage")
                    if not pattern.groupindex:
                        raise LogQLError("parse error at line 1, col %d: at least one named capture must be "
                                         "supplied in the regexp stage" % token[2])
                    for name in pattern.groupindex:
                        if not LABEL.match(name):
                            raise LogQLError("invalid extracted label name %r" % name)
                elif not re.search(r"<[a-zA-Z_][a-zA-Z0-9_]*>", value):
                    raise LogQLError("parse error at line 1, col %d: at least one capture is required in the "
                                     "pattern stage" % token[2])
            elif word in ("unpack", "decolorize"):
                self.next()
            elif word == "line_format":
                self.next()
                self.expect("string", "the line_format template")
            elif word == "label_format":
                self.next()
                self.label_format()
            elif word in ("drop", "keep"):
                self.next()
                self.drop_keep()
            else:
                self.label_filter_expr()

    def line_filter(self):
        op = self.next()[1]
        self.line_filter_value(op)
        while self.is_word("or"):
            self.next()
            self.line_filter_value(op)

    def line_filter_value(self, op):
        if self.is_word("ip"):
            self.next()
            self.expect_op("(")
            self.expect("string", "an IP, range or CIDR")
            self.expect_op(")")
            return
        value = _string_value(self.expect("string", "a quoted string"))
        if op in ("|~", "!~"):
            check_regex(value, "line filter")

    def parser_stage(self, word):
        self.next()
        if word == "logfmt":
            while self.is_op("-") and self.peek(1)[0] == "op" and self.peek(1)[1] == "-":
                self.next()
                self.next()
                flag = self.expect("ident", "a logfmt flag")[1]
                if flag not in ("strict", "keep_empty"):
                    raise LogQLError("invalid logfmt flag --%s" % flag)
        # optional extraction list: name, name="expression", ...
        if self.peek()[0] == "ident" and self.peek()[1] not in KEYWORDS and \
                self.peek(1)[0] in ("op", "eof") and self.peek(1)[1] in ("=", ",", "|", "", ")", "[", "|=", "!=",
                                                                          "|~", "!~"):
            while True:
                self.label_name()
                if self.is_op("="):
                    self.next()
                    self.expect("string", "a quoted expression")
                if not self.is_op(","):
                    break
                self.next()

    def label_format(self):
        while True:
            self.label_name()
            self.expect_op("=")
            token = self.peek()
            if token[0] == "string":
                self.next()
            elif token[0] == "ident":
                self.label_name()
            else:
                raise self.error(expected="a label name or a template string")
            if not self.is_op(","):
                return
            self.next()

    def drop_keep(self):
        while True:
            self.label_name()
            if self.is_op("=", "!=", "=~", "!~"):
                op = self.next()[1]
                value = _string_value(self.expect("string", "a quoted string"))
                if op in ("=~", "!~"):
                    check_regex(value, "drop/keep")
            if not self.is_op(","):
                return
            self.next()

    def unwrap(self):
        self.next()
        if self.is_word("bytes", "duration", "duration_seconds") and self.peek(1)[1] == "(":
            self.next()
            self.expect_op("(")
            self.label_name()
            self.expect_op(")")
        else:
            self.label_name()
        # an unwrap may be followed by label filters on __error__ etc.
        while self.is_op("|") and not (self.peek(1)[0] == "ident" and self.peek(1)[1] == "unwrap"):
            self.next()
            self.label_filter_expr()

    def label_filter_expr(self):
        self.label_filter_term()
        while True:
            if self.is_word("and", "or") or self.is_op(","):
                self.next()
                self.label_filter_term()
            elif self.peek()[0] == "ident" and self.peek()[1] not in KEYWORDS or self.is_op("("):
                self.label_filter_term()  # implicit and
            else:
                return

    def label_filter_term(self):
        if self.is_op("("):
            self.next()
            self.label_filter_expr()
            self.expect_op(")")
            return
        self.label_name()
        token = self.peek()
        if token[0] != "op" or token[1] not in ("=", "!=", "=~", "!~", "==", ">", ">=", "<", "<="):
            raise self.error(expected="a label filter operator")
        op = self.next()[1]
        value = self.peek()
        if value[0] == "string":
            if op not in ("=", "!=", "=~", "!~"):
                raise self.error(expected="a number, duration or bytes value")
            self.next()
            if op in ("=~", "!~"):
                check_regex(_string_value(value), "label filter")
        elif value[0] in ("number", "duration", "bytes"):
            if op in ("=~", "!~"):
                raise self.error(expected="a quoted string")
            self.next()
        elif value[0] == "ident" and value[1] == "ip" and op in ("=", "!="):
            self.next()
            self.expect_op("(")
            self.expect("string", "an IP, range or CIDR")
            self.expect_op(")")
        else:
            raise self.error(expected="a value")


def logql_kind(expression):
    """Parse a LogQL expression: "metric" (also for a number), "log", or raise LogQLError."""
    if not isinstance(expression, str):
        raise LogQLError("the expression must be a string, got %s" % type(expression).__name__)
    kind = _Parser(expression).parse()
    return "metric" if kind == "scalar" else kind


# --------------------------------------------------------------------------------------------- rule contract
_DURATION_FULL = re.compile(r"^%s$" % _DURATION)
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
_ALERT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
GROUP_KEYS = {"name", "interval", "limit", "rules", "query_offset", "labels"}
RULE_KEYS = {"alert", "record", "expr", "for", "keep_firing_for", "labels", "annotations"}


def rule_problems(groups, contract=True):
    """Every problem of a list of rule groups (Prometheus rule format, LogQL expressions), as strings.

    Loki's own checks (structure, names, durations, every expression parses and is a metric query) always apply;
    contract=True adds the project's alert contract (severity, audience, summary/description/runbook).
    """
    problems = []
    if not isinstance(groups, list):
        return ["the rule groups must be a list, got %s" % type(groups).__name__]
    names = set()
    for number, group in enumerate(groups, 1):
        if not isinstance(group, dict):
            problems.append("group %d: must be a mapping" % number)
            continue
        gname = str(group.get("name", ""))
        if not _GROUP_NAME.match(gname):
            problems.append("group %s: name must match [A-Za-z0-9_.:-]+" % json.dumps(gname))
        if gname in names:
            problems.append("group %s: name used twice" % gname)
        names.add(gname)
        for key in sorted(set(group) - GROUP_KEYS, key=str):
            problems.append("group %s: unknown key %s" % (gname, key))
        if "interval" in group and not _DURATION_FULL.match(str(group["interval"])):
            problems.append("group %s: interval %r is not a duration" % (gname, group["interval"]))
        rules = group.get("rules")
        if not isinstance(rules, list) or not rules:
            problems.append("group %s: no rules" % gname)
            continue
        for index, rule in enumerate(rules, 1):
            if not isinstance(rule, dict):
                problems.append("%s/rule %d: must be a mapping" % (gname, index))
                continue
            rname = str(rule.get("alert", rule.get("record", "rule %d" % index)))
            where = "%s/%s" % (gname, rname)
            if ("alert" in rule) == ("record" in rule):
                problems.append("%s: needs exactly one of alert and record" % where)
            for key in sorted(set(rule) - RULE_KEYS, key=str):
                problems.append("%s: unknown key %s" % (where, key))
            for key in ("for", "keep_firing_for"):
                if key in rule and not _DURATION_FULL.match(str(rule[key])):
                    problems.append("%s: %s %r is not a duration" % (where, key, rule[key]))
            try:
                kind = logql_kind(rule.get("expr"))
            except LogQLError as err:
                problems.append("%s: expr is not valid LogQL (%s)" % (where, err))
            else:
                if kind != "metric":
                    problems.append("%s: expr is a log query; rules need a metric query (e.g. "
                                    "sum by (node) (count_over_time({...} |= \"...\" [5m])) > 0), a log query "
                                    "never fires: Loki answers \"rule result is not a vector or scalar\"" % where)
            for key in ("labels", "annotations"):
                value = rule.get(key) or {}
                if not isinstance(value, dict) or not all(
                        isinstance(k, str) and LABEL.match(k) for k in value):
                    problems.append("%s: %s must map label names to strings" % (where, key))
            if "record" in rule:
                if not re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$", str(rule["record"])):
                    problems.append("%s: invalid recording rule name" % where)
                continue
            if "alert" not in rule:
                continue
            if not _ALERT_NAME.match(str(rule["alert"])):
                problems.append("%s: invalid alert name" % where)
            if not contract:
                continue
            labels = rule.get("labels") if isinstance(rule.get("labels"), dict) else {}
            if labels.get("severity") not in ("critical", "warning", "info"):
                problems.append("%s: severity must be critical, warning or info" % where)
            if labels.get("audience") not in ("oncall", "team", "ops"):
                problems.append("%s: audience must be oncall, team or ops" % where)
            annotations = rule.get("annotations") if isinstance(rule.get("annotations"), dict) else {}
            for key in ("summary", "description", "runbook"):
                if not str(annotations.get(key, "") or "").strip():
                    problems.append("%s: annotation %s missing" % (where, key))
    return problems


def loki_rule_problems(groups):
    """Filter: the problems of loki_rule_groups (a list of strings, empty when the rules are fine)."""
    return rule_problems(groups, contract=True)


def loki_logql_kind(expression):
    """Filter: "metric" or "log" for a valid LogQL expression; fails the task for an invalid one."""
    try:
        return logql_kind(expression)
    except LogQLError as err:
        raise AnsibleFilterError(str(err)) from None


class FilterModule:
    def filters(self):
        return {"loki_rule_problems": loki_rule_problems, "loki_logql_kind": loki_logql_kind}
