"""A tiny stdio MCP server for the tests: ``calc(expr)`` (integer + - * and parentheses), ``sleep(seconds)``
and ``die()`` (the process exits at once, as a crashed server would). Run: python tests/mcp_calculator_server.py
(stdio) or ... --http PORT (streamable HTTP).
With ``MCP_CALC_LOG`` set, every ``calc`` call appends its expression to that file."""

import ast
import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("calculator", log_level="ERROR")


def _value(node: ast.expr) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        left, right = _value(node.left), _value(node.right)
        return left + right if isinstance(node.op, ast.Add) else left - right if isinstance(node.op, ast.Sub) else left * right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_value(node.operand)
    raise ToolError(f"only integers, + - * and parentheses are allowed, not {ast.unparse(node)!r}")


@server.tool()
def calc(expr: str) -> str:
    """Evaluate integer arithmetic with + - * and parentheses."""
    if os.environ.get("MCP_CALC_LOG"):
        with open(os.environ["MCP_CALC_LOG"], "a") as log:
            log.write(expr + "\n")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an expression: {expr!r}") from None
    return str(_value(tree.body))


@server.tool()
def sleep(seconds: float) -> str:
    """Sleep for a while, then say so."""
    time.sleep(seconds)
    return "slept"


@server.tool()
def die() -> str:
    """End the server process at once."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":  # streamable HTTP on 127.0.0.1:PORT/mcp
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
