//! `ailb-loadgen` command line.

use super::spec::*;
use crate::args::Args;
use crate::rng::Dist;
use anyhow::{bail, Context, Result};
use std::time::Duration;

pub const USAGE: &str = "\
ailb-loadgen: seeded LLM workloads against gateway URLs

targets (one of):
  --target URL                 repeatable; sessions/requests spread round-robin
  --setup NAME=URL[,URL...]    repeatable; the same workload (same seed) runs against each setup
                               in turn and the JSON is {\"setups\":[{\"name\",\"summary\"}]}
common:
  --workload sessions|skewed|hold   (sessions)
  --seed N (1)  --model NAME (fake-model)  --api chat|completions (chat)  --timeout-ms N (60000)
  --header 'NAME: VALUE @ P'   add a header with probability P (e.g. 'x-fake-fault: reset @ 0.05')
  --abort 'P,MS,before|after'  client abort with probability P, MS after send / after first byte
  --admin URL                  fake pod base URL (repeatable): reset (counters+cache) before each
                               run, read /admin/state after it  (--no-reset keeps state)
  --out FILE                   write the JSON there instead of stdout
sessions:  --sessions 60 --rounds 5 --new-tokens 200 --concurrency 20
           --system-prompts 4 --system-tokens 1000 --max-tokens 32
skewed:    --rate R (Poisson, per s) | --count N (200)   --duration-s S (10)
           --prompt-dist lognormal:300,1.0 --prompt-min 8 --prompt-max 8000
           --output-dist lognormal:32,1.0 --output-min 1 --output-max 1024   --stream
hold:      --concurrency 16 --max-tokens 200 --prompt-tokens 64 --no-stream
The JSON summary goes to stdout (or --out), one human line per run to stderr.
";

/// Parsed command line.
#[derive(Debug, Clone)]
pub struct LoadCli {
    /// `(setup name, config)`; a single unnamed setup for `--target`.
    pub setups: Vec<(String, LoadConfig)>,
    pub out: Option<String>,
}

impl LoadCli {
    pub fn parse(items: Vec<String>) -> Result<Self> {
        let mut a = Args::new(items);
        let mut targets = Vec::new();
        let mut setups: Vec<(String, Vec<String>)> = Vec::new();
        let mut base = LoadConfig::new(Vec::new(), Workload::Sessions(SessionsSpec::default()));
        let mut workload = "sessions".to_string();
        let mut ses = SessionsSpec::default();
        let mut skw = SkewedSpec::default();
        let mut hold = HoldSpec::default();
        let (mut rate, mut count, mut duration) = (None::<f64>, None::<usize>, 10.0f64);
        let (mut concurrency, mut max_tokens) = (None::<usize>, None::<u64>);
        let mut out = None;
        while let Some(flag) = a.next_flag()? {
            match flag.as_str() {
                "--target" => targets.push(a.value(&flag)?),
                "--setup" => {
                    let v = a.value(&flag)?;
                    let (name, urls) = v.split_once('=').context("--setup NAME=URL[,URL]")?;
                    setups.push((name.into(), urls.split(',').map(String::from).collect()));
                }
                "--workload" => workload = a.value(&flag)?,
                "--seed" => base.seed = a.parse(&flag)?,
                "--model" => base.model = a.value(&flag)?,
                "--api" => {
                    base.api = match a.value(&flag)?.as_str() {
                        "chat" => Api::Chat,
                        "completions" => Api::Completions,
                        o => bail!("unknown api {o:?}"),
                    }
                }
                "--timeout-ms" => base.timeout = Duration::from_millis(a.parse(&flag)?),
                "--header" => base.headers.push(parse_header(&a.value(&flag)?)?),
                "--abort" => base.abort = Some(parse_abort(&a.value(&flag)?)?),
                "--admin" => base.admin_urls.push(a.value(&flag)?),
                "--no-reset" => base.reset_pods = false,
                "--out" => out = Some(a.value(&flag)?),
                "--sessions" => ses.sessions = a.parse(&flag)?,
                "--rounds" => ses.rounds = a.parse(&flag)?,
                "--new-tokens" => ses.new_tokens = a.parse(&flag)?,
                "--system-prompts" => ses.system_prompts = a.parse(&flag)?,
                "--system-tokens" => ses.system_tokens = a.parse(&flag)?,
                "--concurrency" => concurrency = Some(a.parse(&flag)?),
                "--max-tokens" => max_tokens = Some(a.parse(&flag)?),
                "--rate" => rate = Some(a.parse(&flag)?),
                "--count" => count = Some(a.parse(&flag)?),
                "--duration-s" => duration = a.parse(&flag)?,
                "--prompt-dist" => skw.prompt_tokens.dist = a.parse::<Dist>(&flag)?,
                "--prompt-min" => skw.prompt_tokens.min = a.parse(&flag)?,
                "--prompt-max" => skw.prompt_tokens.max = a.parse(&flag)?,
                "--output-dist" => skw.max_tokens.dist = a.parse::<Dist>(&flag)?,
                "--output-min" => skw.max_tokens.min = a.parse(&flag)?,
                "--output-max" => skw.max_tokens.max = a.parse(&flag)?,
                "--stream" => skw.stream = true,
                "--no-stream" => hold.stream = false,
                "--prompt-tokens" => hold.prompt_tokens = a.parse(&flag)?,
                "--help" | "-h" => bail!("{USAGE}"),
                o => bail!("unknown flag {o}\n\n{USAGE}"),
            }
        }
        let dur = Duration::from_secs_f64(duration);
        skw.arrivals = match (rate, count) {
            (Some(rate), None) => Arrivals::Poisson {
                rate,
                duration: dur,
            },
            (None, count) => Arrivals::Count {
                count: count.unwrap_or(200),
                duration: dur,
            },
            _ => bail!("give --rate or --count, not both"),
        };
        if let Some(c) = concurrency {
            ses.concurrency = c;
            hold.concurrency = c;
        }
        if let Some(m) = max_tokens {
            ses.max_tokens = m;
            hold.max_tokens = m;
        }
        base.workload = match workload.as_str() {
            "sessions" => Workload::Sessions(ses),
            "skewed" => Workload::Skewed(skw),
            "hold" => Workload::Hold(hold),
            o => bail!("unknown workload {o:?}"),
        };
        let setups = match (targets.is_empty(), setups.is_empty()) {
            (false, true) => vec![(String::new(), LoadConfig { targets, ..base })],
            (true, false) => setups
                .into_iter()
                .map(|(n, t)| {
                    (
                        n,
                        LoadConfig {
                            targets: t,
                            ..base.clone()
                        },
                    )
                })
                .collect(),
            _ => bail!("give --target URL... or --setup NAME=URL..., not both/neither\n\n{USAGE}"),
        };
        Ok(Self { setups, out })
    }
}

/// `NAME: VALUE @ P` (the value may itself contain ':' such as `status:503`).
pub fn parse_header(s: &str) -> Result<HeaderRule> {
    let (hv, p) = s.rsplit_once('@').unwrap_or((s, "1"));
    let (name, value) = hv
        .split_once(':')
        .context("header rule is 'NAME: VALUE @ P'")?;
    let probability: f64 = p.trim().parse().context("bad header probability")?;
    Ok(HeaderRule {
        name: name.trim().to_ascii_lowercase(),
        value: value.trim().into(),
        probability,
    })
}

/// `P,MS,before|after`.
pub fn parse_abort(s: &str) -> Result<AbortRule> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    let [p, ms, phase] = parts.as_slice() else {
        bail!("abort rule is 'P,MS,before|after'");
    };
    Ok(AbortRule {
        probability: p.parse().context("bad abort probability")?,
        after: Duration::from_millis(ms.parse().context("bad abort delay")?),
        phase: match *phase {
            "before" => AbortPhase::BeforeFirstByte,
            "after" => AbortPhase::AfterFirstByte,
            o => bail!("abort phase {o:?} is not before|after"),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_and_setups() {
        let h = parse_header("X-Fake-Fault: status:503 @ 0.25").unwrap();
        assert_eq!(
            (h.name.as_str(), h.value.as_str(), h.probability),
            ("x-fake-fault", "status:503", 0.25)
        );
        assert_eq!(parse_header("x-a: b").unwrap().probability, 1.0);
        let a = parse_abort("0.1,50,after").unwrap();
        assert_eq!(a.phase, AbortPhase::AfterFirstByte);
        assert!(parse_abort("0.1,50").is_err());
        let argv = "--setup a=http://x:1,http://x:2 --setup b=http://y:1 --workload hold --concurrency 7 --seed 9";
        let c = LoadCli::parse(argv.split_whitespace().map(String::from).collect()).unwrap();
        assert_eq!(c.setups.len(), 2);
        assert_eq!(c.setups[0].1.targets.len(), 2);
        assert!(matches!(&c.setups[1].1.workload, Workload::Hold(h) if h.concurrency == 7));
        assert_eq!(c.setups[1].1.seed, 9);
        assert!(LoadCli::parse(vec![]).is_err());
    }
}
