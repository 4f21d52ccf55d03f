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
"""

from __future__ import annotations

import ast
from typing import Any

import pyarrow.compute as pc

from slicefeed.connectors import SpecError

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
    ast.Div: lambda a, b: pc.divide(a, b),
}
_FUNCS = {"is_null": pc.Expression.is_null, "is_valid": pc.Expression.is_valid}


class _Compiler:
    def __init__(self, text: str, label: str):
        self.text = text
        self.label = label
        self.columns: list[str] = []

    def fail(self, node: ast.AST | None, what: str) -> SpecError:
        where = f" at offset {node.col_offset}" if node is not None and hasattr(node, "col_offset") else ""
        return SpecError(
            f"{self.label}: unsupported construct {what}{where} in expression {self.text!r}; "
            f"allowed: {ALLOWED}"
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
        raise self.fail(node, f"{ast.unparse(node)!r} inside a literal list (literals only)")

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
            left = self.expr(node.left)
            out = None
            for op, right_node in zip(node.ops, node.comparators):
                if isinstance(op, (ast.In, ast.NotIn)):
                    if not isinstance(right_node, (ast.List, ast.Tuple, ast.Set)):
                        raise self.fail(right_node, "'in' needs a literal list like [1, 2]")
                    values = [self.literal(e) for e in right_node.elts]
                    lhs = left if isinstance(left, pc.Expression) else pc.scalar(left)
                    term = lhs.isin(values)
                    if isinstance(op, ast.NotIn):
                        term = ~term
                    right = None
                elif type(op) in _CMP:
                    if isinstance(right_node, ast.Constant) and right_node.value is None:
                        raise self.fail(
                            right_node, "comparison with None (use is_null(col) / is_valid(col))"
                        )
                    right = self.expr(right_node)
                    term = _CMP[type(op)](_as_expr(left), right)
                else:
                    raise self.fail(node, f"comparison {type(op).__name__}")
                out = term if out is None else (out & term)
                left = right
            return out
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _ARITH:
                raise self.fail(node, f"operator {type(node.op).__name__}")
            return _ARITH[type(node.op)](_as_expr(self.expr(node.left)), self.expr(node.right))
        if isinstance(node, ast.Name):
            return self.column(node.id)
        if isinstance(node, ast.Constant):
            if node.value is None:
                raise self.fail(node, "None (use is_null(col) / is_valid(col))")
            if isinstance(node.value, (bool, int, float, str)):
                return node.value
            raise self.fail(node, f"literal {node.value!r}")
        if isinstance(node, ast.Call):
            fname = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            if node.keywords or len(node.args) != 1:
                raise self.fail(node, f"call {ast.unparse(node)!r} (one positional argument)")
            (arg,) = node.args
            if fname == "col":
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    raise self.fail(node, "col(...) needs a string column name")
                return self.column(arg.value)
            if fname in _FUNCS:
                return _FUNCS[fname](_as_expr(self.expr(arg)))
            raise self.fail(node, f"function {fname}()")
        raise self.fail(node, f"{type(node).__name__} {ast.unparse(node)!r}")


def _as_expr(v: Any) -> pc.Expression:
    return v if isinstance(v, pc.Expression) else pc.scalar(v)


def compile_expression(text: str, *, label: str = "Filter") -> tuple[pc.Expression, list[str]]:
    """Compiles ``text`` to an Arrow expression.

    Returns:
        ``(expression, referenced column names)``.

    Raises:
        SpecError: on syntax errors or constructs outside the whitelist, naming
            the construct and listing the allowed ones.
    """
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"{label}: expr must be a non-empty string like \"age >= 18\"")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise SpecError(
            f"{label}: cannot parse expression {text!r} ({e.msg} at offset {e.offset}); "
            f"allowed: {ALLOWED}"
        ) from None
    c = _Compiler(text, label)
    out = c.expr(tree.body)
    return _as_expr(out), c.columns
