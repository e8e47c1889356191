//! Provider-generic conformance suite.
