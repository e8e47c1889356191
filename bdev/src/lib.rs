//! Pollux block-device layer.
