//! (being written by a helper)
