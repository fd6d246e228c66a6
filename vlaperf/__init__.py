"""vlaperf: fast, honestly measured inference for flow-matching robot policies."""

import os as _os

__version__ = "0.1.0"

# TORCHINDUCTOR_CACHE_DIR as the process was given it, read when vlaperf is first imported: the first import of
# torch._dynamo (lazy; a torch._refs call makes it, as building a model on the meta device does) runs inductor's
# cache_dir(), which writes the absolute path back, so an empty value (a script's `=$UNSET`) had become the current
# folder by the time the compile lever checked it, and inductor cached there
# (vlaperf.engine.compile.inductor_cache_env).
INDUCTOR_CACHE_AT_START = _os.environ.get("TORCHINDUCTOR_CACHE_DIR")
