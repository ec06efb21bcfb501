"""Memory cores behind one interface (see ``base.Core``) and a registry by name.

Importing this package registers every built-in core: each core module calls
``register_core`` when it is imported below.
"""

from fwrl.memory_modules.base import (  # noqa: F401
    Core,
    CoreConfig,
    build_core,
    core_config_class,
    core_names,
    register_core,
)
from fwrl.memory_modules import (  # noqa: F401  (registration)
    delta_lstm,
    delta_net,
    delta_rnn,
    elstm,
    feedforward,
    gated_delta_net,
    gru,
    linear_transformer,
    lstm,
    rdn,
    srwm,
)
