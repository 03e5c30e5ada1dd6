//! The tail attribution as SQL table functions:
//!
//! - `tail(stage, q)`: the rows of the traces whose `stage` delta is at or above the
//!   lowest value of the HDR bucket of its percentile `q` (`hdr_floor`): the tail set the
//!   report attributes, every column of `traces` with it;
//! - `attribution(stage, q)`: one row per component of the stage, in chain order, with
//!   the report's exact figures: the tail's messages with every component's hops, the
//!   component's mean over them and over all messages, its share of the tail's time and
//!   of its excess.
//!
//! ```sql
//! SELECT component, share, share_of_excess FROM attribution('Total Ingestion', 0.99)
//! ```

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::catalog::view::ViewTable;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::functions_aggregate::expr_fn::{avg, count};
use datafusion::logical_expr::{
    AggregateUDF, Expr, LogicalPlan, LogicalPlanBuilder, cast, col, lit, scalar_subquery,
};
use hoptrace_format::schema::{hop_column, stage_column};
use hoptrace_format::spec::PipelineSpec;

/// Which of the two table functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `tail(stage, q)`.
    Tail,
    /// `attribution(stage, q)`.
    Attribution,
}

/// A table function over the `traces` view's plan and the runs' pipeline spec.
#[derive(Debug)]
pub struct TailTable {
    kind: Kind,
    traces: LogicalPlan,
    spec: PipelineSpec,
    floor: AggregateUDF,
}

impl TailTable {
    /// `kind` over `traces` (the view's plan) of runs of `spec`; `floor` is `hdr_floor`.
    #[must_use]
    pub fn new(kind: Kind, traces: LogicalPlan, spec: PipelineSpec, floor: AggregateUDF) -> Self {
        Self {
            kind,
            traces,
            spec,
            floor,
        }
    }

    /// The stage a name means: a stage's name (any case) or its column.
    fn stage(&self, name: &str) -> Option<&hoptrace_format::spec::StageSpec> {
        self.spec
            .stages
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name) || stage_column(&s.name) == name)
    }

    /// The rows of `traces` in the tail of `column` at `q`.
    fn tail(&self, column: &str, q: f64) -> Result<LogicalPlanBuilder> {
        let threshold = LogicalPlanBuilder::from(self.traces.clone())
            .aggregate(
                Vec::<Expr>::new(),
                vec![self.floor.call(vec![col(column), lit(q)])],
            )?
            .build()?;
        LogicalPlanBuilder::from(self.traces.clone())
            .filter(col(column).gt_eq(scalar_subquery(Arc::new(threshold))))
    }

    /// One row per component of `stage`: its figures over the tail at `q` (the messages
    /// with every component's hops) and over all messages.
    fn attribution(&self, stage: &hoptrace_format::spec::StageSpec, q: f64) -> Result<LogicalPlan> {
        let components = self.spec.components(stage);
        let head = stage_column(&stage.name);
        let delta = |from: &str, to: &str| {
            cast(col(hop_column(to)), DataType::Int64)
                - cast(col(hop_column(from)), DataType::Int64)
        };
        let every_hop = components
            .iter()
            .flat_map(|c| [&c.from, &c.to])
            .map(|h| col(hop_column(h)).is_not_null())
            .reduce(Expr::and)
            .unwrap_or_else(|| lit(true));
        let mut in_tail = vec![
            count(lit(1)).alias("messages"),
            avg(col(&head)).alias("head_tail"),
        ];
        let mut over_all = vec![avg(col(&head)).alias("head_all")];
        for (i, c) in components.iter().enumerate() {
            in_tail.push(avg(delta(&c.from, &c.to)).alias(format!("tail_{i}")));
            over_all.push(avg(delta(&c.from, &c.to)).alias(format!("all_{i}")));
        }
        let tail = self
            .tail(&head, q)?
            .filter(every_hop)?
            .aggregate(Vec::<Expr>::new(), in_tail)?
            .build()?;
        let all = LogicalPlanBuilder::from(self.traces.clone())
            .aggregate(Vec::<Expr>::new(), over_all)?
            .build()?;
        let both = LogicalPlanBuilder::from(tail).cross_join(all)?.build()?;
        let mut out: Option<LogicalPlanBuilder> = None;
        for (i, c) in components.iter().enumerate() {
            let (t, a) = (col(format!("tail_{i}")), col(format!("all_{i}")));
            let row = LogicalPlanBuilder::from(both.clone())
                .project(vec![
                    lit(i as i64).alias("position"),
                    lit(c.name.clone()).alias("component"),
                    lit(c.from.clone()).alias("from_hop"),
                    lit(c.to.clone()).alias("to_hop"),
                    col("messages"),
                    (t.clone() / col("head_tail")).alias("share"),
                    ((t.clone() - a.clone()) / (col("head_tail") - col("head_all")))
                        .alias("share_of_excess"),
                    t.alias("tail_mean_ns"),
                    a.alias("all_mean_ns"),
                ])?
                .build()?;
            out = Some(match out {
                Some(b) => b.union(row)?,
                None => LogicalPlanBuilder::from(row),
            });
        }
        out.map_or_else(
            || plan_err!("attribution: {} has no component", stage.name),
            |b| b.build(),
        )
    }
}

/// A literal argument, else `None`.
fn literal(e: &Expr) -> Option<&ScalarValue> {
    match e {
        Expr::Literal(v, _) => Some(v),
        _ => None,
    }
}

impl TableFunctionImpl for TailTable {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let name_of = match self.kind {
            Kind::Tail => "tail",
            Kind::Attribution => "attribution",
        };
        let usage = format!(
            "{name_of}(stage, q) takes a stage's name (e.g. 'Total Ingestion') and a \
             quantile strictly between 0 and 1 (e.g. 0.99)"
        );
        let [stage, q] = args.exprs() else {
            return plan_err!("{usage}");
        };
        let Some(name) = literal(stage).and_then(|v| match v {
            ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
            _ => None,
        }) else {
            return plan_err!("{usage}");
        };
        let Some(stage) = self.stage(&name) else {
            let stages: Vec<&str> = self.spec.stages.iter().map(|s| s.name.as_str()).collect();
            return plan_err!(
                "{name_of}: no stage '{name}' in the runs' pipeline (stages: {})",
                stages.join(", ")
            );
        };
        let q = literal(q).and_then(|v| match v {
            ScalarValue::Float64(Some(q)) => Some(*q),
            ScalarValue::Float32(Some(q)) => Some(f64::from(*q)),
            _ => None,
        });
        let Some(q) = q.filter(|q| *q > 0.0 && *q < 1.0) else {
            return plan_err!("{usage}");
        };
        let plan = match self.kind {
            Kind::Tail => self.tail(&stage_column(&stage.name), q)?.build()?,
            Kind::Attribution => self.attribution(stage, q)?,
        };
        Ok(Arc::new(ViewTable::new(plan, None)))
    }
}
