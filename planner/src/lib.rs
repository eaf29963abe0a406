//! The offline planner: reads published model files, builds each stage's graph, folds,
//! orders, cuts into segments, lays out the arena, packs weights and writes a `.plan`.
#![forbid(unsafe_code)]

pub mod load;
