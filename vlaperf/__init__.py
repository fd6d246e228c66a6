"""vlaperf: fast, honestly measured inference for flow-matching robot policies."""

__version__ = "0.1.0"
