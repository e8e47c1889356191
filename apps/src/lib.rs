//! Shared code of the Pollux applications.
