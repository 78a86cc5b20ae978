//! The benchmark's pictures: reads `target/waitlock-bench.json` (written by
//! `cargo bench --bench contention`) and renders SVG plots into `docs/plots/`, which
//! docs/benchmarks.md embeds. Run right after the contention bench, so that plots and tables
//! come from the same run:
//!
//! ```sh
//! cargo bench --bench contention && cargo bench --bench plots
//! ```
//!
//! - `handoff-cdf-<workers>x<processes>.svg`: the handoff gap (one holder's release to the next
//!   holder's acquisition, across workers) as a cumulative distribution, per locker;
//! - `calls-per-acquisition.svg`: Redis calls per acquisition, per locker and configuration;
//! - `wait-timeout-overshoot.svg`: how far past its deadline a wait returned, per locker;
//! - `curve-<name>.svg`: the cost curves of `cargo bench --bench curves`
//!   (`target/waitlock-curves.json`), two figures of each point against its x (log scale).
//!
//! Pure Rust (plotters' SVG backend): no font or image library needed.

use plotters::prelude::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
];

type Res = Result<(), Box<dyn std::error::Error>>;

fn quantiles(v: &Value, key: &str) -> Option<Vec<f64>> {
    v.get(key)?.as_array()?.iter().map(Value::as_f64).collect()
}

fn text(v: &Value, key: &str) -> String {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

/// A CDF per named series (41 quantiles each), x on a log scale in ms.
fn cdf(path: &Path, title: &str, x_desc: &str, series: &[(String, Vec<f64>)]) -> Res {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|(_, q)| q.iter().copied())
        .filter(|x| *x > 0.0)
        .collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(1e-3);
    let hi = all.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo / 1.5..hi * 1.5).log_scale(), 0f64..1f64)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc("fraction at or below")
        .draw()?;
    for (i, (name, q)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> = q
            .iter()
            .enumerate()
            .map(|(j, x)| (x.max(lo / 1.5), j as f64 / (q.len() - 1) as f64))
            .collect();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// Bars: one group per configuration, one bar per locker.
fn bars(
    path: &Path,
    title: &str,
    y_desc: &str,
    groups: &BTreeMap<String, Vec<(String, f64)>>,
) -> Res {
    let lockers: Vec<String> = {
        let mut l: Vec<String> = groups
            .values()
            .flat_map(|g| g.iter().map(|(n, _)| n.clone()))
            .collect();
        l.sort();
        l.dedup();
        l
    };
    let top = groups
        .values()
        .flat_map(|g| g.iter().map(|(_, v)| *v))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max)
        * 1.15;
    let n = lockers.len().max(1) as f64;
    let names: Vec<&String> = groups.keys().collect();
    let root = SVGBackend::new(path, (720, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d(0f64..names.len() as f64, 0f64..top.max(1.0))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len() + 1)
        .x_label_formatter(&|x| {
            let i = (*x - 0.5).round();
            if (x - 0.5 - i).abs() < 0.01 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .y_desc(y_desc)
        .draw()?;
    for (li, locker) in lockers.iter().enumerate() {
        let color = COLORS[li % COLORS.len()];
        let rects: Vec<Rectangle<(f64, f64)>> = names
            .iter()
            .enumerate()
            .filter_map(|(gi, g)| {
                let v = groups[*g].iter().find(|(n, _)| n == locker)?.1;
                let x0 = gi as f64 + 0.1 + 0.8 * li as f64 / n;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + 0.8 / n * 0.9, v)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(rects)?
            .label(locker.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One curve: for each of `figures`, a panel of its value against the point's x (log scale).
fn curve(
    path: &Path,
    title: &str,
    x_desc: &str,
    points: &[&Value],
    figures: &[(&str, &str)],
) -> Res {
    let root = SVGBackend::new(path, (360 * figures.len() as u32, 380)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title_area, body) = root.split_vertically(30);
    title_area.titled(title, ("sans-serif", 18))?;
    let xs: Vec<f64> = points.iter().map(|p| num(p, "x")).collect();
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min).max(1.0);
    let hi = xs.iter().copied().fold(0.0, f64::max).max(lo * 10.0);
    for (i, (panel, (key, desc))) in body
        .split_evenly((1, figures.len()))
        .iter()
        .zip(figures)
        .enumerate()
    {
        let series: Vec<(f64, f64)> = points
            .iter()
            .map(|p| (num(p, "x"), num(p, key)))
            .filter(|(_, y)| y.is_finite())
            .collect();
        let top = series.iter().map(|(_, y)| *y).fold(0.0, f64::max).max(1e-3) * 1.2;
        let mut chart = ChartBuilder::on(panel)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((lo / 1.5..hi * 1.5).log_scale(), 0f64..top)?;
        chart.configure_mesh().x_desc(x_desc).y_desc(*desc).draw()?;
        let color = COLORS[i % COLORS.len()];
        chart.draw_series(LineSeries::new(series.clone(), color.stroke_width(2)))?;
        chart.draw_series(series.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    root.present()?;
    Ok(())
}

/// The JSON objects of `file` in target/, one per line; none when it is missing.
fn read_reports(root: &Path, file: &str) -> Result<Vec<Value>, Box<dyn std::error::Error>> {
    let Ok(body) = std::fs::read_to_string(root.join("target").join(file)) else {
        return Ok(Vec::new());
    };
    Ok(body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?)
}

fn main() -> Res {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let reports = read_reports(root, "waitlock-bench.json")?;
    let curves = read_reports(root, "waitlock-curves.json")?;
    if reports.is_empty() && curves.is_empty() {
        return Err(
            "target/waitlock-bench.json and target/waitlock-curves.json are missing: run \
             `cargo bench --bench contention` or `cargo bench --bench curves` first"
                .into(),
        );
    }
    let out = root.join("docs/plots");
    std::fs::create_dir_all(&out)?;
    let mut written = Vec::new();
    for (name, title, x_desc, figures) in [
        (
            "refreshing",
            "Held locks kept alive by one locker",
            "locks held (log scale)",
            [
                ("script_calls_per_period", "script calls per refresh period"),
                ("redis_cpu_pct_of_core", "Redis CPU, % of one core"),
            ],
        ),
        (
            "held",
            "Acquire + release of another key while one process holds N",
            "keys held (log scale)",
            [
                ("pair_p50_ms", "pair latency p50, ms"),
                ("redis_cpu_us_per_pair", "Redis CPU per pair, us"),
            ],
        ),
        (
            "queued",
            "Handoffs with N waiters queued on one key (one process)",
            "waiters queued (log scale)",
            [
                ("gap_p50_ms", "handoff gap p50, ms"),
                ("redis_cpu_us_per_acq", "Redis CPU per acquisition, us"),
            ],
        ),
        (
            "processes",
            "Handoffs among N processes contending for one key",
            "processes (log scale)",
            [
                ("gap_p50_ms", "handoff gap p50, ms"),
                ("redis_cpu_us_per_acq", "Redis CPU per acquisition, us"),
            ],
        ),
    ] {
        let points: Vec<&Value> = curves.iter().filter(|p| text(p, "curve") == name).collect();
        if points.is_empty() {
            continue;
        }
        let path = out.join(format!("curve-{name}.svg"));
        curve(&path, title, x_desc, &points, &figures)?;
        written.push(path);
    }

    // Handoff CDFs, one plot per configuration.
    let mut by_config: BTreeMap<String, Vec<(String, Vec<f64>)>> = BTreeMap::new();
    let mut calls: BTreeMap<String, Vec<(String, f64)>> = BTreeMap::new();
    for r in reports.iter().filter(|r| text(r, "workload") == "handoff") {
        let config = format!("{}x{}", num(r, "workers") as u64, num(r, "procs") as u64);
        if let Some(q) = quantiles(r, "gap_diff_quantiles_ms") {
            by_config
                .entry(config.clone())
                .or_default()
                .push((text(r, "locker"), q));
        }
        calls
            .entry(config)
            .or_default()
            .push((text(r, "locker"), num(r, "calls_per_acq")));
    }
    for (config, series) in &by_config {
        let path = out.join(format!("handoff-cdf-{config}.svg"));
        cdf(
            &path,
            &format!("Handoff gap, {config} (workers x processes)"),
            "release to the next holder's acquisition, ms (log scale)",
            series,
        )?;
        written.push(path);
    }
    if !calls.is_empty() {
        let path = out.join("calls-per-acquisition.svg");
        bars(
            &path,
            "Redis calls per acquisition (handoff workload)",
            "calls",
            &calls,
        )?;
        written.push(path);
    }
    let over: Vec<(String, Vec<f64>)> = reports
        .iter()
        .filter(|r| text(r, "workload") == "wait-timeout")
        .filter_map(|r| Some((text(r, "locker"), quantiles(r, "overshoot_quantiles_ms")?)))
        .collect();
    if !over.is_empty() {
        let path = out.join("wait-timeout-overshoot.svg");
        cdf(
            &path,
            "Wait-timeout overshoot past the deadline",
            "ms past the deadline (log scale)",
            &over,
        )?;
        written.push(path);
    }
    for p in &written {
        println!("wrote {}", p.display());
    }
    if written.is_empty() {
        return Err("no handoff, wait-timeout or curve reports to plot".into());
    }
    Ok(())
}
