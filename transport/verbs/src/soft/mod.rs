//! Software RDMA provider over shared memory.
