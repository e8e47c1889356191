//! Pollux verbs layer.
