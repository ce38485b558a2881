"""Views of TextArena games for small models (``env.view`` of the ``textarena`` adapter).

``tictactoe(text, player_id)``: TicTacToe-v0's observation (about 500 characters on the first turn, 300 on
the next) as one short line, ``board 0x2 3o5 678``: the last board the text shows, row by row, our marks
``o``, the opponent's ``x``, a free cell its number (the move that takes it). ``invalid `` is put in front
when the text reports an invalid move of ours. With ``env.move: "[{}]"`` a model writes a free cell's digit
and the game receives ``[4]``: the recipe ``textarena_tictactoe`` (docs/environments.md).
"""

from __future__ import annotations

import re

CELL = re.compile(r"^\s*(\S)\s*\|\s*(\S)\s*\|\s*(\S)\s*$")
SYMBOL = {0: "O", 1: "X"}  # TicTacToe-v0: Player 0 is 'O', Player 1 'X'


def _last_board(text: str) -> list[str]:
    rows = [m.groups() for m in map(CELL.match, text.rsplit("Current Board:", 1)[-1].splitlines()) if m]
    if len(rows) < 3:
        raise ValueError(f"no TicTacToe board in the observation: {text[-200:]!r}")
    return [c for row in rows[:3] for c in row]


def tictactoe(text: str, player_id: int) -> str:
    """``board 0x2 3o5 678`` (module docstring), ``invalid `` in front after an invalid move of ours."""
    ours = SYMBOL[player_id]
    cells = ["o" if c == ours else "x" if c in SYMBOL.values() else c for c in _last_board(text)]
    board = " ".join("".join(cells[i:i + 3]) for i in (0, 3, 6))
    invalid = f"Player {player_id} attempted an invalid move" in text
    return f"{'invalid ' if invalid else ''}board {board}"
