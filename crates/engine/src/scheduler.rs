//! Scheduler (being written).
