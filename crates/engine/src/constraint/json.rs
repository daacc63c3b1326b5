//! JSON constraint (placeholder; being written).
