//! The command line: clap arguments, the TOML config file, `config
//! check/show`, and one library function per subcommand. `main.rs` parses
//! with these and calls one of the functions; nothing below this layer
//! knows about the command line.

mod args;
pub mod commands;
pub mod config_cmd;
pub mod file;
pub mod ops;
mod route;

pub use args::*;
