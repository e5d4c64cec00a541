"""What every endpoint of the OpenAI API reads: the data plane, the model catalog, the options
(config.OpenAIOptions) and the --chat-template text, read once at start."""

from __future__ import annotations

from dataclasses import dataclass

from inferd.supervisor.config import OpenAIOptions
from inferd.supervisor.core.dataplane import InProcessDataPlane

from .catalog import Catalog


@dataclass
class Api:
    dp: InProcessDataPlane
    catalog: Catalog
    options: OpenAIOptions
    chat_template: str | None = None
    control_mode: str = "none"
