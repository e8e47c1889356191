//! Owned-buffer wrappers over io_uring and Linux native AIO.
