//! Integration and end-to-end tests of proxyplan live in `tests/`.
