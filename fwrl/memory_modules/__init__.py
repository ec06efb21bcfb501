"""Memory cores behind one interface (see ``base.Core``) and a registry by name.

Importing this package registers every built-in core.
"""

from fwrl.memory_modules.base import (  # noqa: F401
    Core,
    CoreConfig,
    build_core,
    core_config_class,
    core_names,
    register_core,
)
from fwrl.memory_modules import feedforward, lstm  # noqa: F401  (registration)
from fwrl.memory_modules import _optional_cores  # noqa: F401  (registration)
