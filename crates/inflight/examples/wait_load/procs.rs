//! The two sides of a `--procs 2` run as two OS processes: copies of this program started with
//! `--child URL PREFIX`, driven over their stdin and stdout by the parent, timed on the host's clock.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use inflight::{Limiter, Policy, RedisStore};
use tokio::sync::mpsc;

use super::{hold, load, now_us, percentiles, queue, summary, Args, Error, Record};

/// A copy of this program started with `--child URL PREFIX`, one side of a `--procs 2` run.
struct Side {
    child: Child,
    to: ChildStdin,
    from: BufReader<ChildStdout>,
}

impl Side {
    fn start(url: &str, prefix: &str) -> Result<Self, Error> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--child", url, prefix])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let (to, from) = (
            child.stdin.take().ok_or("no stdin")?,
            child.stdout.take().ok_or("no stdout")?,
        );
        Ok(Self {
            child,
            to,
            from: BufReader::new(from),
        })
    }

    /// Sends `command`; the rest of the answer line that starts with `answer`.
    fn ask(&mut self, command: &str, answer: &str) -> Result<String, Error> {
        if !command.is_empty() {
            writeln!(self.to, "{command}")?;
        }
        let mut line = String::new();
        self.from.read_line(&mut line)?;
        let rest = line
            .trim_end()
            .strip_prefix(answer)
            .ok_or(format!("{answer} expected, got {line:?}"))?;
        Ok(rest.trim_start().to_owned())
    }
}

/// The two sides as two processes; the parent reads Redis's CPU time around the load.
pub(super) async fn processes(url: &str, args: &Args) -> Result<(), Error> {
    let prefix = format!("inflight-wait-{}:", std::process::id());
    let store = RedisStore::builder(url).prefix(prefix.clone()).open()?;
    let mut sides = [Side::start(url, &prefix)?, Side::start(url, &prefix)?];
    for side in &mut sides {
        side.ask("", "ready")?;
    }
    let cpu_before = store.redis_cpu_time().await?;
    let started = now_us() + 200_000; // both start together, on the host's clock
    for side in &mut sides {
        let command = format!(
            "load {started} {} {} {}",
            args.secs,
            args.tasks / 2,
            args.limit
        );
        writeln!(side.to, "{command}")?;
    }
    let mut records = Vec::new();
    for (n, side) in sides.iter_mut().enumerate() {
        for line in side
            .ask("", "records")?
            .split(';')
            .filter(|r| !r.is_empty())
        {
            let mut fields = line.split(',').map(str::parse::<u64>);
            let mut field = || fields.next().ok_or("a short record").map_err(Error::from);
            let (asked, ended, admitted) = (field()??, field()??, field()?? == 1);
            records.push(Record {
                side: n,
                asked,
                ended,
                admitted,
            });
        }
    }
    let cpu = store.redis_cpu_time().await?.saturating_sub(cpu_before);
    let load = summary(&records, started, 2);
    let admissions = records.iter().filter(|r| r.admitted).count().max(1);
    let cpu_us = cpu.as_secs_f64() * 1e6 / admissions as f64;
    let mut took = Vec::with_capacity(args.trials);
    for trial in 0..args.trials {
        let (holder, waiter) = if trial % 2 == 0 { (0, 1) } else { (1, 0) };
        sides[holder].ask("hold", "held")?;
        sides[waiter].ask("wait", "queued")?;
        let released: u64 = sides[holder].ask("release", "released")?.parse()?;
        let admitted: u64 = sides[waiter].ask("", "admitted")?.parse()?;
        took.push(admitted.saturating_sub(released));
        sides[waiter].ask("drop", "dropped")?;
    }
    for side in &mut sides {
        writeln!(side.to, "quit")?;
        side.child.wait()?;
    }
    let (tasks, limit) = (args.tasks, args.limit);
    println!(
        "{{\"store\": \"redis\", \"processes\": 2, \"tasks\": {tasks}, \"limit\": {limit}, {load}, \
         \"redis_cpu_us_per_admission\": {cpu_us:.1}, \"wake_across\": {}}}",
        percentiles(took)
    );
    Ok(())
}

/// One side of a `--procs 2` run: commands on stdin, answers on stdout.
pub(super) async fn child(url: &str, prefix: &str) -> Result<(), Error> {
    let store = RedisStore::builder(url).prefix(prefix.to_owned()).open()?;
    let waker = Limiter::builder(store.clone())
        .policy(Policy::new(1, 0))
        .build();
    let warm = format!("warm-{}", std::process::id());
    drop(waker.try_acquire(&warm).await?); // connected, scripts loaded
    let (lines, mut commands) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            let _ = lines.send(line);
        }
    });
    println!("ready");
    let (mut held, mut admitted) = (None, None);
    while let Some(line) = commands.recv().await {
        let words: Vec<&str> = line.split(' ').collect();
        match words[..] {
            ["load", started, secs, tasks, limit] => {
                let limiter = Limiter::builder(store.clone())
                    .policy(Policy::new(limit.parse()?, 0))
                    .build();
                let run = Duration::from_secs_f64(secs.parse()?);
                let records = load(&[limiter], tasks.parse()?, started.parse()?, run).await;
                let text: Vec<String> = records
                    .iter()
                    .map(|r| format!("{},{},{}", r.asked, r.ended, u8::from(r.admitted)))
                    .collect();
                println!("records {}", text.join(";"));
            }
            ["hold"] => {
                held = Some(hold(&waker).await);
                println!("held");
            }
            ["wait"] => {
                let waiter = queue(&waker).await;
                println!("queued");
                let (permit, at) = waiter.await?;
                admitted = Some(permit.ok_or("the waiter was not admitted")?);
                println!("admitted {at}");
            }
            ["release"] => {
                let at = now_us();
                drop(held.take());
                println!("released {at}");
            }
            ["drop"] => {
                drop(admitted.take());
                println!("dropped");
            }
            _ => break,
        }
    }
    Ok(())
}
