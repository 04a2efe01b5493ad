//! `ailb-bench-gateway`: the emulator (`ailb-gateway`, same command line) with the bench's
//! profiling switches installed (`ailb_bench::instruments`). `ailb-bench` starts its gateways
//! from this binary; the tests and `make run` start the plain one.

fn main() {
    ailb_gateway::instrument::install(Box::new(ailb_bench::instruments::FromEnv::read()));
    ailb_gateway::cli::main()
}
