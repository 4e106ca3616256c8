use dusk_compiler::codegen::{compile_stages, Target};
fn main() {
    let dir = std::env::args().nth(1).unwrap_or("/tmp/ptx".into());
    std::fs::create_dir_all(&dir).unwrap();
    let ks = vec![
        dusk_kernels::quantize::build(&dusk_kernels::quantize::QuantizeConfig::new(128, 4))
            .unwrap(),
        dusk_kernels::quantize::build(&dusk_kernels::quantize::QuantizeConfig::new(128, 8))
            .unwrap(),
        dusk_kernels::spgemv::build(&dusk_kernels::spgemv::SpgemvConfig::new(128, 16, 4, 4))
            .unwrap(),
        dusk_kernels::spgemv::build(&dusk_kernels::spgemv::SpgemvConfig::new(128, 16, 1, 4))
            .unwrap(),
        dusk_kernels::spgemv::build(&dusk_kernels::spgemv::SpgemvConfig::new(128, 16, 4, 8))
            .unwrap(),
    ];
    for k in ks {
        let t = std::time::Instant::now();
        let s = compile_stages(&k, &Target::sm90a()).unwrap();
        println!("{} {:?}", k.name, t.elapsed());
        std::fs::write(format!("{dir}/{}.ptx", k.name), &s.ptx).unwrap();
        std::fs::write(format!("{dir}/{}.ir", k.name), &s.ir).unwrap();
        std::fs::write(format!("{dir}/{}.ll", k.name), &s.llvm_optimized).unwrap();
    }
}
