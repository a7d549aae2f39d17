"""The simulator's face: what other components use of it (the tuner's what-if runs on the virtual clock).

The server itself runs as `batchscope sim` (batchscope.simulator.cli); everything else here is internal.
"""

from batchscope.simulator.config import Deployment, ServeConfig, validation_message
from batchscope.simulator.cost import StepCostModel
from batchscope.simulator.engine import EngineCore, Step
from batchscope.simulator.profile import Profile
from batchscope.simulator.responses import VLLM_VERSION
from batchscope.simulator.stats import EngineStats
from batchscope.simulator.virtual import (
    ClosedLoop,
    FixedArrivals,
    PromptIds,
    RequestRecord,
    RequestSpec,
    StepObserver,
    TimedResult,
    run_timed,
)

__all__ = [
    "VLLM_VERSION", "ClosedLoop", "Deployment", "EngineCore", "EngineStats", "FixedArrivals", "Profile",
    "PromptIds", "RequestRecord", "RequestSpec", "ServeConfig", "Step", "StepCostModel", "StepObserver",
    "TimedResult", "run_timed", "validation_message",
]
