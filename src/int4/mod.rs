//! INT4 placeholder
