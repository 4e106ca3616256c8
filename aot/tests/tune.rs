//! The tuner on the CPU interpreter: a planted fast-but-wrong config is rejected by the
//! reference check and never wins; `spgemv_quant`'s real space tunes end to end; results
//! survive a round trip through the persistent cache; a broken timer never wins, and a run
//! in which no config passes says why.

use dusk_aot::space::Limits;
use dusk_aot::spgemv_tune::{SpgemvProblem, SpgemvShape};
use dusk_aot::tune::{self, Candidate, DeviceId, Rejection, Status, TuneCache};
use dusk_compiler::{DType, Kernel, KernelBuilder};
use dusk_kernels::ops::Dusk;
use dusk_runtime::{Arg, Buffer, Device, LoadedKernel, Measured, Timing};
use std::sync::Arc;

/// `y[i] = 2 x[i]`, `block` elements a program.
fn double(block: usize) -> Kernel {
    let mut b = KernelBuilder::new("double");
    let x = b.param_ptr("x", DType::F32);
    let y = b.param_ptr("y", DType::F32);
    let pid = b.program_id(0);
    let base = b.mul_c(pid, block as i64);
    let base = b.splat(base, &[block]);
    let offs = b.arange(0, block as i64);
    let idx = b.add(base, offs);
    let px = b.add_ptr(x, idx);
    let v = b.load(px);
    let two = b.f32(2.0);
    let two = b.splat(two, &[block]);
    let r = b.mul(v, two);
    let py = b.add_ptr(y, idx);
    b.store(py, r);
    b.finish().unwrap()
}

/// A config of `double`: its block, and the fraction of the grid it launches. The planted
/// config launches half the programs: twice as fast, and wrong.
struct Doubling<'a> {
    dev: &'a Device,
    block: usize,
    planted: bool,
    x: &'a Buffer<f32>,
    y: Buffer<f32>,
    kernel: Option<LoadedKernel>,
}

impl Doubling<'_> {
    fn launch(&self) -> dusk_runtime::Result<()> {
        let programs = (self.x.len() / self.block) as u32;
        let grid = if self.planted { programs / 2 } else { programs };
        let k = self.kernel.as_ref().expect("prepared");
        self.dev
            .launch(k, [grid, 1, 1], &[Arg::from(self.x), Arg::from(&self.y)])
    }
}

impl Candidate for Doubling<'_> {
    fn label(&self) -> String {
        format!(
            "block {}{}",
            self.block,
            if self.planted { " (planted)" } else { "" }
        )
    }
    fn config(&self) -> serde_json::Value {
        serde_json::json!({"block": self.block, "planted": self.planted})
    }
    fn kernel_hash(&self) -> Result<String, String> {
        Ok(dusk_aot::bundle::ir_hash(&double(self.block)))
    }
    fn prepare(&mut self) -> Result<(), String> {
        let ir = Arc::new(double(self.block));
        self.kernel = Some(self.dev.load_kernel(ir, None).map_err(|e| e.to_string())?);
        Ok(())
    }
    fn check(&mut self) -> Result<(), Rejection> {
        let fail = |e: dusk_runtime::RuntimeError| Rejection::Failed(e.to_string());
        self.dev.fill_bytes(&mut self.y, 0xFF).map_err(fail)?;
        self.launch().map_err(fail)?;
        let (x, y) = (
            self.x.download().map_err(fail)?,
            self.y.download().map_err(fail)?,
        );
        match x.iter().zip(&y).position(|(a, b)| 2.0 * a != *b) {
            None => Ok(()),
            Some(i) => Err(Rejection::Wrong(format!(
                "y[{i}] = {}, want {}",
                y[i],
                2.0 * x[i]
            ))),
        }
    }
    fn time(&mut self) -> Result<Measured, String> {
        self.dev
            .time_calls(1, |_| self.launch())
            .map_err(|e| e.to_string())
    }
}

/// A config that cannot be compiled (as ptxas or an out-of-resources load would fail).
struct Broken;

impl Candidate for Broken {
    fn label(&self) -> String {
        "broken".into()
    }
    fn config(&self) -> serde_json::Value {
        serde_json::json!({"broken": true})
    }
    fn kernel_hash(&self) -> Result<String, String> {
        Ok("0".repeat(16))
    }
    fn prepare(&mut self) -> Result<(), String> {
        Err("ptxas: too many resources requested for launch".into())
    }
    fn check(&mut self) -> Result<(), Rejection> {
        unreachable!("never prepared")
    }
    fn time(&mut self) -> Result<Measured, String> {
        unreachable!("never prepared")
    }
}

#[test]
fn a_planted_fast_wrong_config_never_wins() {
    let dev = Device::cpu();
    let n = 1 << 14;
    let x = dev
        .upload(&(0..n).map(|i| i as f32 * 0.5).collect::<Vec<_>>())
        .unwrap();
    let make = |block, planted| Doubling {
        dev: &dev,
        block,
        planted,
        x: &x,
        y: dev.alloc(n).unwrap(),
        kernel: None,
    };
    // The planted config is first among its block size and does half the work.
    // A config that fails to compile is recorded, and tuning goes on.
    let cands: Vec<Box<dyn Candidate>> = vec![
        Box::new(make(256, false)),
        Box::new(make(1024, true)),
        Box::new(Broken),
        Box::new(make(1024, false)),
    ];
    let rec = tune::run("double n<=16384", &DeviceId::of(&dev), cands, vec![], false);
    assert!(
        matches!(&rec.trials[2].status, Status::Failed { stage, .. } if stage == "compile"),
        "{:?}",
        rec.trials[2]
    );
    assert!(
        matches!(rec.trials[1].status, Status::Wrong { .. }),
        "{:?}",
        rec.trials[1]
    );
    let best = rec.best_trial().expect("a config passed");
    assert_eq!(best.config["planted"], false, "{rec:?}");
    assert!(matches!(best.status, Status::Ok { .. }));
}

/// A config that runs and checks, and whose timer gives `us`.
struct Timer(f64);

impl Candidate for Timer {
    fn label(&self) -> String {
        format!("timer {}", self.0)
    }
    fn config(&self) -> serde_json::Value {
        serde_json::json!({"timer": self.0.to_string()})
    }
    fn kernel_hash(&self) -> Result<String, String> {
        Ok("1".repeat(16))
    }
    fn prepare(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn check(&mut self) -> Result<(), Rejection> {
        Ok(())
    }
    fn time(&mut self) -> Result<Measured, String> {
        Ok(Measured {
            samples_us: vec![self.0],
            timing: Timing::Cpu,
            calls: 1,
            graph_error: None,
        })
    }
}

#[test]
fn a_zero_or_non_finite_time_never_wins() {
    let dev = DeviceId::of(&Device::cpu());
    let cands: Vec<Box<dyn Candidate>> = vec![
        Box::new(Timer(0.0)),
        Box::new(Timer(f64::NAN)),
        Box::new(Timer(-1.0)),
        Box::new(Timer(f64::INFINITY)),
        Box::new(Timer(3.5)),
    ];
    let rec = tune::run("timers", &dev, cands, vec![], false);
    for t in &rec.trials[..4] {
        assert!(
            matches!(&t.status, Status::Failed { stage, error } if stage == "time" && error.contains("the timer gave")),
            "{t:?}"
        );
    }
    assert_eq!(rec.best, Some(4));
    assert_eq!(rec.why_none_passed(), None);
}

#[test]
fn when_every_config_fails_the_record_says_why() {
    let dev = DeviceId::of(&Device::cpu());
    let cands: Vec<Box<dyn Candidate>> =
        vec![Box::new(Broken), Box::new(Timer(0.0)), Box::new(Broken)];
    let pruned = vec![(
        "huge".to_string(),
        serde_json::json!({}),
        "about 300 registers a thread".to_string(),
    )];
    let rec = tune::run("broken", &dev, cands, pruned, false);
    assert_eq!(rec.best, None);
    assert_eq!(
        rec.why_none_passed().unwrap(),
        "none of the 4 configs passed (2 failed at compile, 1 failed at time, 1 pruned); \
         the first, broken, failed at compile: ptxas: too many resources requested for launch"
    );
    // Every config pruned: nothing was tried.
    let rec = tune::run(
        "pruned",
        &dev,
        vec![],
        vec![("huge".into(), serde_json::json!({}), "too big".into())],
        false,
    );
    assert_eq!(
        rec.why_none_passed().unwrap(),
        "its only config, huge, was pruned: too big"
    );
}

#[test]
fn spgemv_tunes_on_the_interpreter_and_the_cache_round_trips() {
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let shape = SpgemvShape {
        batch: 1,
        num_q_heads: 4,
        num_kv_heads: 1,
        head_dim: 128,
        context: 40,
        bits: 4,
        page_frac: 1.0,
    };
    let (configs, pruned) = shape.space(&Limits::H100);
    assert!(configs.len() >= 3, "{configs:?}");
    assert!(pruned.is_empty());
    // Two configs keep the interpreter quick: the default (tensor cores) and dp2a.
    let problem = SpgemvProblem::new(&dusk, shape, 7).unwrap();
    let dp2a = *configs.iter().find(|c| !c.tensor_cores).unwrap();
    let key = shape.key().to_string();
    let dev = DeviceId::of(dusk.device());
    let rec = tune::run(
        &key,
        &dev,
        problem.candidates(&[configs[0], dp2a]),
        vec![],
        false,
    );
    for t in &rec.trials {
        assert!(matches!(t.status, Status::Ok { .. }), "{t:?}");
        assert_eq!(t.ir_hash.len(), 16);
    }
    assert!(rec.best.is_some());

    let path = std::env::temp_dir().join(format!("dusk-tune-test-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut cache = TuneCache::open(&path).unwrap();
    let space = tune::space_hash(&problem.candidates(&[configs[0], dp2a]));
    let ckey = TuneCache::key(&space, &dev, &key);
    cache.insert(ckey.clone(), rec.clone());
    cache.save().unwrap();
    let again = TuneCache::open(&path).unwrap();
    assert_eq!(again.get(&ckey), Some(&rec));
    assert_eq!(again.results_for(&rec.trials[0].ir_hash).len(), 1);
    // Looked up by shape alone (no inputs), as an engine would: over the whole space.
    let whole = tune::space_hash(&problem.candidates(&configs));
    let mut full = rec.clone();
    full.best = Some(2);
    cache.insert(TuneCache::key(&whole, &dev, &key), full);
    assert_eq!(shape.tuned(&cache, &dev, &Limits::H100), Some(configs[2]));
    let other = SpgemvShape {
        context: 4096,
        ..shape
    };
    assert_eq!(other.tuned(&cache, &dev, &Limits::H100), None);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn top_p_search_tunes_on_the_interpreter_with_pruning() {
    use dusk_aot::search_tune::{SearchProblem, SearchShape};
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let shape = SearchShape {
        rows: 2,
        len: 1500,
        p: 0.9,
    };
    let (configs, pruned) = shape.space(&Limits::H100);
    // 8192 candidates on 4 warps would need 64 a thread: dropped before compiling.
    assert!(pruned
        .iter()
        .any(|(c, _)| c.block == 8192 && c.num_warps == 4));
    let problem = SearchProblem::new(&dusk, shape, 3).unwrap();
    let dev = DeviceId::of(dusk.device());
    let rec = tune::run(
        "search",
        &dev,
        problem.candidates(&configs[..2]),
        vec![],
        false,
    );
    for t in &rec.trials {
        assert!(matches!(t.status, Status::Ok { .. }), "{t:?}");
    }
    // Looked up by shape alone, as an engine would: over the whole space.
    let mut cache = TuneCache::in_memory();
    assert_eq!(shape.tuned(&cache, &dev, &Limits::H100), None);
    let whole = tune::space_hash(&problem.candidates(&configs));
    let mut full = rec.clone();
    full.best = Some(1);
    cache.insert(TuneCache::key(&whole, &dev, &shape.key().to_string()), full);
    assert_eq!(shape.tuned(&cache, &dev, &Limits::H100), Some(configs[1]));
}

#[test]
fn dense_attention_tunes_on_the_interpreter() {
    use dusk_aot::attention_tune::{AttentionProblem, AttentionShape};
    let dusk = Dusk::new(Device::cpu()).unwrap();
    let shape = AttentionShape {
        batch: 1,
        num_q_heads: 4,
        num_kv_heads: 2,
        head_dim: 128,
        context: 100,
    };
    let (configs, pruned) = shape.space(&Limits::H100, 132);
    assert!(configs.len() >= 8);
    // 32 tokens a step on 4 warps with two tiles prefetched cannot fit with group 2.
    assert!(pruned.is_empty() || pruned.iter().all(|(t, _)| t.block_tokens == 32));
    let problem = AttentionProblem::new(&dusk, shape, 5).unwrap();
    let dev = DeviceId::of(dusk.device());
    let rec = tune::run(
        "attention",
        &dev,
        problem.candidates(&configs[..2]),
        vec![],
        false,
    );
    for t in &rec.trials {
        assert!(matches!(t.status, Status::Ok { .. }), "{t:?}");
    }
    // Looked up by shape alone, as an engine would: over the whole space.
    let mut cache = TuneCache::in_memory();
    assert_eq!(shape.tuned(&cache, &dev, &Limits::H100, 132), None);
    let whole = tune::space_hash(&problem.candidates(&configs));
    let mut full = rec.clone();
    full.best = Some(1);
    cache.insert(TuneCache::key(&whole, &dev, &shape.key().to_string()), full);
    assert_eq!(
        shape.tuned(&cache, &dev, &Limits::H100, 132),
        Some(configs[1])
    );
}
