"""A small, safe expression language compiled to ``pyarrow.compute.Expression``.

The text is parsed with :mod:`ast` (``mode="eval"``) and only a whitelist of
node types is translated; nothing is ever evaluated by Python. Grammar::

    expr   := expr and expr | expr or expr | not expr | cmp
    cmp    := arith (== | != | < | <= | > | >=) arith ...   (chains allowed)
            | arith in [literal, ...] | arith not in [literal, ...]
    arith  := arith (+ | - | * | /) arith | -arith | atom
    atom   := column | col("any name") | literal | is_null(column) | is_valid(column)
            | (expr)
    literal:= int | float | "string" | True | False

``/`` divides as Python does: a float64 result, also for integers (a zero
divisor marks the row bad). A comparison of an integer column with a float
is made in float64, as NumPy makes it, and an unsigned column is compared with
a non-negative literal as unsigned, so values beyond 2**53 (or 2**63) compare
instead of failing Arrow's exact conversion. ``+ - *`` of a uint64 operand and
a non-negative literal are made in uint64 likewise; a uint64 operand meeting a
signed one is computed in int64 by Arrow, and a row whose value does not fit is
bad, as is a result beyond the type (``u - 1`` of 0 in uint64). ``in [...]``
matches as ``==`` does (:func:`_in_operands`): in float64 for a float operand
or a list holding a float, with -0.0 equal to 0.0 as in Python. A row on which
a kernel still fails is found by bisection and marked bad, never left as
Arrow's own error. A bare column name means the name
as written: Python's parser folds identifiers to NFKC (the ligature ``\ufb01`` to
``fi``), which would name another column.

Size is bounded before anything is built (a 10,000-term ``or`` chain
overflows Arrow's expression simplifier; 3,000 nested ``not`` overflow
Python's stack): at most :data:`MAX_EXPR_CHARS` characters,
:data:`MAX_EXPR_TERMS` columns and literals (values of ``in [...]`` lists
count separately, up to :data:`MAX_IN_VALUES`), nesting depth
:data:`MAX_EXPR_DEPTH`, and integer literals that fit in 64 bits.
"""

from __future__ import annotations

import ast
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from slicefeed.connectors import SpecError, printable, short_repr
from slicefeed.transforms._dtypes import as_float64

#: Longest expression text (checked before parsing).
MAX_EXPR_CHARS = 100_000
#: Most columns and literals in one expression (``in`` list values aside).
MAX_EXPR_TERMS = 1_000
#: Most values in all ``in [...]`` lists of one expression.
MAX_IN_VALUES = 10_000
#: Deepest nesting of operators, calls and parentheses.
MAX_EXPR_DEPTH = 64
_INT_RANGE = (-(2**63), 2**63 - 1)

ALLOWED = (
    "column names, col('name with spaces'), literals (numbers, strings, True, False), "
    "comparisons (==, !=, <, <=, >, >=), 'in [...]' / 'not in [...]' with literal lists, "
    "and / or / not, arithmetic (+, -, *, /, unary -), is_null(column), is_valid(column), "
    "parentheses"
)

_CMP = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
_ARITH = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: pc.divide_checked(a, b),
}


def _as_float(v: Any, t: Any) -> Any:
    """An operand of ``/`` (an expression or array of type ``t``, or a Python
    number) as float64 when it is an integer, so that ``/`` divides as Python
    does (:func:`as_float64` with ``integers_only``: other types are left to
    Arrow's own kernels, a string is refused there)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return as_float64(v, t, integers_only=True) if isinstance(t, pa.DataType) else v
    return float(v)


def _coerced(left: Any, ltype: Any, right: Any, rtype: Any) -> tuple[Any, Any]:
    """The two sides of a comparison, made comparable where Arrow's implicit
    conversion would refuse values: an integer column against a float (literal
    or column) in float64; an unsigned 64-bit column against a non-negative
    integer literal as unsigned (against a negative one, in float64); int64
    against uint64 in float64. ``ltype``/``rtype``: the Arrow type of a column
    side, ``int``/``float`` for a literal, None when unknown (arithmetic)."""
    def is_int(t: Any) -> bool:
        return isinstance(t, pa.DataType) and pa.types.is_integer(t)

    def is_float(t: Any) -> bool:
        return t is float or (isinstance(t, pa.DataType) and pa.types.is_floating(t))

    def f64(v: Any) -> Any:
        return v.cast(pa.float64(), safe=False)

    for a, at, b, bt, swap in ((left, ltype, right, rtype, False), (right, rtype, left, ltype, True)):
        if is_int(at) and is_float(bt):
            a = f64(a)
        elif at == pa.uint64() and bt is int:
            if b >= 0:
                b = pa.scalar(b, pa.uint64())
            else:
                a = f64(a)
        elif at == pa.uint64() and is_int(bt) and bt != pa.uint64() and pa.types.is_signed_integer(bt):
            a, b = f64(a), f64(b)
        else:
            continue
        return (b, a) if swap else (a, b)
    return left, right


def _unsigned_literal(left: Any, ltype: Any, right: Any, rtype: Any) -> tuple[Any, Any]:
    """Operands of ``+ - *``: a non-negative integer literal meeting a uint64
    operand becomes a uint64 scalar, so the arithmetic is made in uint64, as
    such a comparison is (Arrow's common type of uint64 and an int64 literal
    is int64, which refuses values beyond 2**63). A result outside uint64
    (``u - 1`` of 0) is the per-row overflow :class:`_RowErrors` marks."""
    def lit(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    if ltype == pa.uint64() and lit(right):
        right = pa.scalar(right, pa.uint64())
    elif rtype == pa.uint64() and lit(left):
        left = pa.scalar(left, pa.uint64())
    return left, right


def _in_operands(lhs: Any, ltype: Any, values: list[Any]) -> tuple[Any, Any]:
    """``(lhs, value set)`` of ``lhs in [values]``, matched as ``==`` matches
    (``ltype``: the Arrow type of ``lhs``, None when unknown).

    A float operand, or an integer one against a list holding a float, is
    compared in float64, -0.0 made 0.0 on both sides (Arrow's ``is_in`` hashes
    a float's bits, so ``-0.0 in [0.0]`` was false; Python says true). An
    integer operand meets the list's integers in its own type, leaving out
    those outside its range, which equal none of its values (Arrow would cast
    the list to the operand's type and refuse them). Other lists (text, bools,
    a mix) take Arrow's own rules."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not isinstance(ltype, pa.DataType) or not nums or len(nums) != len(values):
        return lhs, _value_set(values)
    if pa.types.is_floating(ltype) or (
            pa.types.is_integer(ltype) and any(isinstance(v, float) for v in nums)):
        lhs = pc.add(lhs.cast(pa.float64(), safe=False), 0.0)  # -0.0 + 0.0 is 0.0
        return lhs, pa.array([float(v) + 0.0 for v in nums], pa.float64())
    if pa.types.is_integer(ltype):
        import numpy as np

        info = np.iinfo(ltype.to_pandas_dtype())
        return lhs, pa.array([v for v in nums if info.min <= v <= info.max], ltype)
    return lhs, _value_set(values)


_FUNCS = {"is_null": pc.Expression.is_null, "is_valid": pc.Expression.is_valid}


class _Compiler:
    def __init__(self, text: str, label: str, schema: Any = None):
        self.text = text
        self.label = label
        self.schema = schema
        self.columns: list[str] = []

    def name(self, node: ast.Name) -> str:
        """The column a bare name means: as written, not as Python folded it."""
        return ast.get_source_segment(self.text.strip(), node) or node.id

    def result_type(self, node: ast.AST) -> Any:
        """The Arrow type of ``node``'s value over the schema's columns (None
        without a schema, or for a literal): evaluated over an empty table."""
        if self.schema is None:
            return None
        try:
            v = _RowErrors(self.schema.empty_table(), self).eval(node)
        except Exception:  # noqa: BLE001 - the expression's own check names the problem
            return None
        t = _type(v)
        return t if isinstance(t, pa.DataType) else None

    def type_of(self, node: ast.AST) -> Any:
        """The Arrow type of a column or arithmetic operand, ``int``/``float``
        of a number literal, else None."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = self.type_of(node.operand)
            return inner if inner in (int, float) else None
        if isinstance(node, ast.Constant) and not isinstance(node.value, bool):
            return type(node.value) if isinstance(node.value, (int, float)) else None
        name = None
        if isinstance(node, ast.Name):
            name = self.name(node)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "col"
              and len(node.args) == 1 and isinstance(node.args[0], ast.Constant)):
            name = node.args[0].value
        if name is None:
            # An arithmetic operand: the type of its result.
            return self.result_type(node) if isinstance(node, (ast.BinOp, ast.UnaryOp)) else None
        if self.schema is None or name not in self.schema.names:
            return None
        return self.schema.field(name).type

    def fail(self, node: ast.AST | None, what: str) -> SpecError:
        where = f" at offset {node.col_offset}" if node is not None and hasattr(node, "col_offset") else ""
        return SpecError(
            f"{self.label}: unsupported construct {what}{where} in expression "
            f"{short_repr(self.text)}; allowed: {ALLOWED}"
        )

    def column(self, name: str) -> pc.Expression:
        if name not in self.columns:
            self.columns.append(name)
        return pc.field(name)

    def literal(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int, float, str)):
            return node.value
        if (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, (int, float))
            and not isinstance(node.operand.value, bool)
        ):
            return -node.operand.value
        raise self.fail(node, f"{short_repr(ast.unparse(node))} inside a literal list (literals only)")

    def expr(self, node: ast.AST) -> Any:
        if isinstance(node, ast.BoolOp):
            parts = [self.expr(v) for v in node.values]
            out = parts[0]
            for p in parts[1:]:
                out = (out & p) if isinstance(node.op, ast.And) else (out | p)
            return out
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return ~self.expr(node.operand)
            if isinstance(node.op, ast.USub):
                operand = self.expr(node.operand)
                if isinstance(operand, (int, float)) and not isinstance(operand, bool):
                    return -operand
                return pc.negate_checked(operand)
            if isinstance(node.op, ast.UAdd):
                return self.expr(node.operand)
            raise self.fail(node, f"operator {type(node.op).__name__}")
        if isinstance(node, ast.Compare):
            left, left_node = self.expr(node.left), node.left
            out = None
            for op, right_node in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    if not isinstance(right_node, (ast.List, ast.Tuple, ast.Set)):
                        raise self.fail(right_node, "'in' needs a literal list like [1, 2]")
                    values = [self.literal(e) for e in right_node.elts]
                    lhs, value_set = _in_operands(
                        _as_expr(left), self.type_of(left_node), values)
                    term = lhs.isin(value_set)
                    if isinstance(op, ast.NotIn):
                        term = ~term
                    right = None
                elif type(op) in _CMP:
                    if isinstance(right_node, ast.Constant) and right_node.value is None:
                        raise self.fail(
                            right_node, "comparison with None (use is_null(col) / is_valid(col))"
                        )
                    right = self.expr(right_node)
                    a, b = _coerced(left, self.type_of(left_node), right, self.type_of(right_node))
                    term = _CMP[type(op)](_as_expr(a), _as_expr(b))
                else:
                    raise self.fail(node, f"comparison {type(op).__name__}")
                out = term if out is None else (out & term)
                left, left_node = right, right_node
            return out
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _ARITH:
                raise self.fail(node, f"operator {type(node.op).__name__}")
            left, right = self.expr(node.left), self.expr(node.right)
            if isinstance(node.op, ast.Div):
                left = _as_float(left, self.result_type(node.left))
                right = _as_float(right, self.result_type(node.right))
            elif isinstance(left, int) or isinstance(right, int):
                left, right = _unsigned_literal(
                    left, self.result_type(node.left) if isinstance(right, int) else None,
                    right, self.result_type(node.right) if isinstance(left, int) else None)
            return _ARITH[type(node.op)](_as_expr(left), right)
        if isinstance(node, ast.Name):
            return self.column(self.name(node))
        if isinstance(node, ast.Constant):
            if node.value is None:
                raise self.fail(node, "None (use is_null(col) / is_valid(col))")
            if isinstance(node.value, (bool, int, float, str)):
                return node.value
            raise self.fail(node, f"literal {short_repr(node.value)}")
        if isinstance(node, ast.Call):
            fname = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            if node.keywords or len(node.args) != 1:
                raise self.fail(node, f"call {short_repr(ast.unparse(node))} (one positional argument)")
            (arg,) = node.args
            if fname == "col":
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    raise self.fail(node, "col(...) needs a string column name")
                return self.column(arg.value)
            if fname in _FUNCS:
                return _FUNCS[fname](_as_expr(self.expr(arg)))
            raise self.fail(node, f"function {printable(fname, 120)}()")
        raise self.fail(node, f"{type(node).__name__} {short_repr(ast.unparse(node))}")


def _check_size(tree: ast.AST, text: str, label: str) -> None:
    """Counts terms, ``in`` values and depth without recursion; SpecError past a limit."""
    terms = in_values = 0
    stack: list[tuple[ast.AST, int]] = [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_EXPR_DEPTH:
            raise SpecError(
                f"{label}: expression nests deeper than {MAX_EXPR_DEPTH} levels; split it into "
                "several filter steps or use 'in [...]' instead of long chains"
            )
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            in_values += len(node.elts)
            if in_values > MAX_IN_VALUES:
                raise SpecError(
                    f"{label}: 'in' lists of the expression hold more than {MAX_IN_VALUES} "
                    f"values; the limit is {MAX_IN_VALUES}. Filter on a join key or split the list"
                )
        elif isinstance(node, (ast.Name, ast.Constant)):
            terms += 1
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            lo, hi = _INT_RANGE
            if not lo <= node.value <= hi + 1:  # -2**63 is written as -(2**63)
                raise SpecError(
                    f"{label}: integer literal {short_repr(node.value, 40)} in the expression does "
                    f"not fit in 64 bits ({lo}..{hi})"
                )
        stack += [(c, depth + 1) for c in ast.iter_child_nodes(node)
                  if not isinstance(c, (ast.expr_context, ast.cmpop, ast.boolop, ast.operator, ast.unaryop))]
    if terms > MAX_EXPR_TERMS:
        raise SpecError(
            f"{label}: expression has {terms} terms (columns and literals); the limit is "
            f"{MAX_EXPR_TERMS}. Use 'in [...]' for long lists of values, or split the filter"
        )


def _as_expr(v: Any) -> pc.Expression:
    return v if isinstance(v, pc.Expression) else pc.scalar(v)


def compile_expression(text: str, *, label: str = "Filter",
                       schema: Any = None) -> tuple[pc.Expression, list[str]]:
    """Compiles ``text`` to an Arrow expression for the columns of ``schema``.

    The schema gives the operand types: with it, ``/`` makes floats of integer
    operands and comparisons are made comparable (:func:`_coerced`); without
    it (a check of the text alone) Arrow's own rules apply.

    Returns:
        ``(expression, referenced column names)``.

    Raises:
        SpecError: on syntax errors or constructs outside the whitelist, naming
            the construct and listing the allowed ones.
    """
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"{label}: expr must be a non-empty string like \"age >= 18\"")
    if len(text) > MAX_EXPR_CHARS:
        raise SpecError(
            f"{label}: expression is {len(text)} characters long; the limit is {MAX_EXPR_CHARS}"
        )
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise SpecError(
            f"{label}: cannot parse expression {short_repr(text)} ({e.msg} at offset {e.offset}); "
            f"allowed: {ALLOWED}"
        ) from None
    except (RecursionError, MemoryError):
        raise SpecError(
            f"{label}: expression nests deeper than {MAX_EXPR_DEPTH} levels; split it into "
            "several filter steps"
        ) from None
    _check_size(tree, text, label)
    c = _Compiler(text, label, schema)
    try:
        out = c.expr(tree.body)
        return _as_expr(out), c.columns
    except SpecError:
        raise
    except (OverflowError, TypeError, ValueError, ArithmeticError) as e:
        # A literal Arrow cannot hold, or operands Arrow cannot combine.
        raise SpecError(
            f"{label}: cannot build expression {short_repr(text)}: {short_repr(str(e).splitlines()[0] if str(e) else type(e).__name__)}"
        ) from None


def canonical_expression(text: str) -> str:
    """The parsed form of an expression: equal for two texts that differ only in
    spacing, parentheses or quoting (``x>1``, ``( x > 1 )``), else different.

    The syntax tree written as ``ast.dump`` writes it, without positions and
    without fields that are None or empty lists, on every Python version
    (``ast.dump`` itself leaves out empty lists from Python 3.13 on, which
    would change the fingerprint of ``is_null(x)`` with the interpreter).
    Column names are taken as written, as the compiler takes them (Python
    folds identifiers to NFKC, which would make the ligature ``\ufb01`` and
    ``fi`` one name). Literals keep their type (``1`` and ``1.0`` are
    different expressions). The text must be one :func:`compile_expression`
    accepts (its depth is bounded there).
    """
    stripped = text.strip()
    tree = ast.parse(stripped, mode="eval")
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = ast.get_source_segment(stripped, node) or node.id
    return _dump(tree.body)


def _dump(node: Any) -> str:
    """``ast.dump(node)`` of Python 3.13 (None and empty-list fields left out)."""
    if isinstance(node, list):
        return "[" + ", ".join(_dump(x) for x in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = [(name, getattr(node, name, None)) for name in node._fields]
    return f"{type(node).__name__}(" + ", ".join(
        f"{name}={_dump(v)}" for name, v in fields if v is not None and v != []) + ")"


# -- row-level errors ---------------------------------------------------------------

_CHECKED = {ast.Add: "add_checked", ast.Sub: "subtract_checked", ast.Mult: "multiply_checked"}
_WRAPPING = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply"}
_F64 = {ast.Add: "add", ast.Sub: "subtract", ast.Mult: "multiply"}
_CMP_FN = {ast.Eq: "equal", ast.NotEq: "not_equal", ast.Lt: "less", ast.LtE: "less_equal",
           ast.Gt: "greater", ast.GtE: "greater_equal"}


class _RowErrors:
    """Evaluates a checked expression over a table, collecting rows where it fails.

    Arrow evaluates an expression for a whole batch or raises; this walks the
    same syntax tree with one vectorised kernel call per node and, where a
    kernel raises (integer division by zero, overflow), computes that node's
    failing rows with vectorised masks (a zero divisor; a float64 result
    outside the integer range), nulls them and goes on. Only rows a mask
    misses (int64 results within float64 rounding of the range limit) fall
    back to bisecting that one node's inputs. So the cost is a few kernel
    calls per node, whatever the number of bad rows.
    """

    def __init__(self, table: Any, compiler: _Compiler):
        import numpy as np

        self.table = table
        self.c = compiler
        self.bad = np.zeros(table.num_rows, dtype=bool)

    def _null_where(self, v: Any, mask: Any) -> Any:
        import pyarrow as pa

        if not isinstance(v, (pa.Array, pa.ChunkedArray)) or not mask.any():
            return v
        return pc.if_else(pa.array(mask), pa.nulls(len(v), v.type), v)

    def _fail_rows(self, fn: Any, *args: Any) -> Any:
        """Rows where ``fn(*args)`` raises, by bisection over the arrays (rare fallback)."""
        import numpy as np
        import pyarrow as pa

        n = self.table.num_rows
        out = np.zeros(n, dtype=bool)
        stack = [(0, n)]
        while stack:
            lo, hi = stack.pop()
            if hi <= lo:
                continue
            part = [a.slice(lo, hi - lo) if isinstance(a, (pa.Array, pa.ChunkedArray)) else a
                    for a in args]
            try:
                fn(*part)
                continue
            except (pa.ArrowInvalid, OverflowError, ZeroDivisionError):
                pass
            if hi - lo == 1:
                out[lo] = True
            else:
                mid = (lo + hi) // 2
                stack += [(lo, mid), (mid, hi)]
        return out

    def _guarded(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``, the rows on which it raises (by bisection: a fallback
        for failures no vectorised mask foresees) nulled and marked bad."""
        import pyarrow as pa

        try:
            return fn(*args)
        except (pa.ArrowInvalid, OverflowError, ZeroDivisionError):
            pass
        mask = self._fail_rows(fn, *args)
        self.bad |= mask
        return fn(*(self._null_where(a, mask) for a in args))

    def _arith(self, op: type, a: Any, b: Any) -> Any:
        import numpy as np
        import pyarrow as pa

        name = "divide_checked" if op is ast.Div else _CHECKED[op]
        if op is ast.Div:
            a, b = _as_float(a, _type(a)), _as_float(b, _type(b))
        else:
            a, b = _unsigned_literal(a, _type(a), b, _type(b))
        if not isinstance(a, (pa.Array, pa.ChunkedArray)) and not isinstance(b, (pa.Array, pa.ChunkedArray)):
            try:  # literals only: fails for every row or none
                return pc.call_function(name, [pa.scalar(a), pa.scalar(b)]).as_py()
            except (pa.ArrowInvalid, OverflowError, ZeroDivisionError):
                self.bad[:] = True
                return None
        n = self.table.num_rows
        mask = np.zeros(n, dtype=bool)
        if op is ast.Div:
            # Zero divisors first: Arrow's failing kernel costs per bad value.
            zero = pc.equal(b, 0)
            mask |= np.asarray(pc.fill_null(zero, False).to_numpy(zero_copy_only=False)
                               if isinstance(zero, (pa.Array, pa.ChunkedArray))
                               else np.full(n, bool(zero.as_py())), dtype=bool)
            if isinstance(a, (pa.Array, pa.ChunkedArray)):  # null / 0 is null, not an error
                mask &= np.asarray(pc.is_valid(a).to_numpy(zero_copy_only=False), dtype=bool)
        else:
            # uint64 meeting a signed operand: Arrow computes in int64 and
            # refuses a uint64 value beyond it; no type holds both, so that
            # row is bad.
            ta, tb = _type(a), _type(b)
            signed = (lambda t: isinstance(t, pa.DataType) and pa.types.is_signed_integer(t))
            for u, other in ((a, tb), (b, ta)):
                if _type(u) == pa.uint64() and (signed(other) or other is int):
                    big = pc.greater(u, pa.scalar(2**63 - 1, pa.uint64()))
                    mask |= np.asarray(pc.fill_null(big, False).to_numpy(zero_copy_only=False), dtype=bool)
        if not mask.any():
            try:
                return pc.call_function(name, [a, b])
            except (pa.ArrowInvalid, OverflowError, ZeroDivisionError):
                pass
        if op is not ast.Div:
            # The result type from no rows: the values may not convert.
            out_type = pc.call_function(_WRAPPING[op], [_no_rows(a), _no_rows(b)]).type
            if pa.types.is_integer(out_type):
                info = np.iinfo(out_type.to_pandas_dtype())
                f = pc.call_function(_F64[op], [pc.cast(a, pa.float64(), safe=False) if not isinstance(a, (int, float)) else float(a),
                                                pc.cast(b, pa.float64(), safe=False) if not isinstance(b, (int, float)) else float(b)])
                over = pc.or_(pc.less(f, float(info.min)), pc.greater(f, float(info.max)))
                mask |= np.asarray(pc.fill_null(over, False).to_numpy(zero_copy_only=False), dtype=bool)
        a2, b2 = self._null_where(a, mask), self._null_where(b, mask)
        self.bad |= mask
        return self._guarded(lambda x, y: pc.call_function(name, [x, y]), a2, b2)

    def _negate(self, v: Any) -> Any:
        import numpy as np
        import pyarrow as pa

        try:
            return pc.negate_checked(v)
        except (pa.ArrowInvalid, OverflowError):
            info = np.iinfo(v.type.to_pandas_dtype())
            mask = np.asarray(pc.fill_null(pc.equal(v, info.min), False).to_numpy(zero_copy_only=False), dtype=bool)
            self.bad |= mask
            return pc.negate_checked(self._null_where(v, mask))

    def eval(self, node: ast.AST) -> Any:
        c = self.c
        if isinstance(node, ast.BoolOp):
            parts = [self.eval(v) for v in node.values]
            out = parts[0]
            fn = pc.and_kleene if isinstance(node.op, ast.And) else pc.or_kleene
            for p in parts[1:]:
                out = fn(out, p)
            return out
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.Not):
                return pc.invert(self.eval(node.operand))
            if isinstance(node.op, ast.USub):
                v = self.eval(node.operand)
                return -v if isinstance(v, (int, float)) else self._negate(v)
            return self.eval(node.operand)
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            out = None
            for op, right_node in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    values = [c.literal(e) for e in right_node.elts]  # type: ignore[attr-defined]
                    lhs, value_set = _in_operands(left, _type(left), values)
                    term = self._guarded(lambda x, vs=value_set: pc.is_in(x, value_set=vs), lhs)
                    if isinstance(op, ast.NotIn):
                        term = pc.invert(term)
                    right = None
                else:
                    right = self.eval(right_node)
                    fn = _CMP_FN[type(op)]
                    term = self._guarded(
                        lambda x, y, fn=fn: pc.call_function(fn, [x, y]),
                        *_coerced(left, _type(left), right, _type(right)))
                out = term if out is None else pc.and_kleene(out, term)
                left = right
            return out
        if isinstance(node, ast.BinOp):
            return self._arith(type(node.op), self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.Name):
            return self.table.column(c.name(node))
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Call):
            (arg,) = node.args
            fname = node.func.id  # type: ignore[attr-defined]
            if fname == "col":
                return self.table.column(arg.value)  # type: ignore[attr-defined]
            v = self.eval(arg)
            return pc.is_null(v) if fname == "is_null" else pc.is_valid(v)
        raise c.fail(node, type(node).__name__)


def _type(v: Any) -> Any:
    """An evaluated operand's type for :func:`_coerced`."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return type(v)
    return getattr(v, "type", None)


def _no_rows(v: Any) -> Any:
    """``v`` without rows when it is an array (a kernel's result type, no values)."""
    import pyarrow as pa

    return v.slice(0, 0) if isinstance(v, (pa.Array, pa.ChunkedArray)) else v


def _value_set(values: list[Any]) -> Any:
    """The list as an array of Arrow's inferred type. Integers no one Arrow
    integer type holds together (``-1`` and ``2**63``) become float64: such a
    list meets an operand of unknown type (a check of the text alone, a
    literal); a column's type is met by :func:`_in_operands`."""
    import pyarrow as pa

    try:
        return pa.array(values)
    except (OverflowError, pa.ArrowInvalid):
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            return pa.array([float(v) for v in values], pa.float64())
        raise


def evaluate_with_errors(text: str, table: Any, *, label: str = "Filter") -> tuple[Any, Any]:
    """Evaluates the predicate ``text`` over ``table``, isolating rows where it fails.

    For the error path of a filter whose vectorised evaluation raised: the
    cost is a few vectorised kernel calls per expression node, not per bad
    row (see :class:`_RowErrors`).

    Returns:
        ``(mask, bad)``: a boolean array (null where unknown or where the row
        failed) and a NumPy bool array of the rows on which evaluation failed.
    """
    compile_expression(text, label=label)  # validates and checks limits
    tree = ast.parse(text.strip(), mode="eval")
    ev = _RowErrors(table, _Compiler(text, label))
    mask = ev.eval(tree.body)
    import pyarrow as pa

    if not isinstance(mask, (pa.Array, pa.ChunkedArray)):
        mask = pa.array([mask] * table.num_rows, pa.bool_())
    return mask, ev.bad
