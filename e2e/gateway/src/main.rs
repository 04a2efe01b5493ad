//! `ailb-gateway --config FILE [--set key=value]...` (the command line is `ailb_gateway::cli`).

fn main() {
    ailb_gateway::cli::main()
}
