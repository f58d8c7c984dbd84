"""The turn: one response, from a parsed request to its stored end.

    engine.py   `prepare_turn`, `Turn.run`, `run_rounds`: the one path every
                transport (SSE, JSON, WebSocket, background) runs
    tools.py    which gateway tools a turn offers (configured and hosted
                MCP servers), and how their calls run
"""

from .engine import Emit, Resources, Session, Turn, TurnOutcome, note_chat_chunks, prepare_turn, report_outcome, run_rounds

__all__ = ["Emit", "Resources", "Session", "Turn", "TurnOutcome", "note_chat_chunks", "prepare_turn", "report_outcome", "run_rounds"]
