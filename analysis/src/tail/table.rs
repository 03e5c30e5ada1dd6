//! `tail(stage, q)` in SQL: the rows of the traces whose `stage` delta is at or above the
//! lowest value of the HDR bucket of its percentile `q` (`hdr_floor`): the tail set the
//! report attributes, every column of `traces` with it.
//!
//! ```sql
//! SELECT count(*), avg(broker_time_ns) / avg(total_ingestion_ns)
//! FROM tail('Total Ingestion', 0.99) WHERE status = 'complete'
//! ```

use std::sync::Arc;

use datafusion::catalog::view::ViewTable;
use datafusion::catalog::{TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::{Result, ScalarValue, plan_err};
use datafusion::logical_expr::{
    AggregateUDF, Expr, LogicalPlan, LogicalPlanBuilder, col, lit, scalar_subquery,
};
use hoptrace_format::schema::stage_column;

/// The table function, over the `traces` view's plan and the spec's stage names.
#[derive(Debug)]
pub struct TailTable {
    traces: LogicalPlan,
    stages: Vec<String>,
    floor: AggregateUDF,
}

impl TailTable {
    /// `tail` over `traces` (the view's plan), whose stages are `stages`; `floor` is
    /// `hdr_floor`.
    #[must_use]
    pub fn new(traces: LogicalPlan, stages: Vec<String>, floor: AggregateUDF) -> Self {
        Self {
            traces,
            stages,
            floor,
        }
    }

    /// The stage column a name means: a stage's name (any case) or its column.
    fn column(&self, name: &str) -> Option<String> {
        self.stages
            .iter()
            .find(|s| s.eq_ignore_ascii_case(name) || stage_column(s) == name)
            .map(|s| stage_column(s))
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
        let usage = "tail(stage, q) takes a stage's name (e.g. 'Total Ingestion') and a \
                     quantile strictly between 0 and 1 (e.g. 0.99)";
        let [stage, q] = args.exprs() else {
            return plan_err!("{usage}");
        };
        let Some(name) = literal(stage).and_then(|v| match v {
            ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) => Some(s.clone()),
            _ => None,
        }) else {
            return plan_err!("{usage}");
        };
        let Some(column) = self.column(&name) else {
            return plan_err!(
                "tail: no stage '{name}' in the runs' pipeline (stages: {})",
                self.stages.join(", ")
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
        let threshold = LogicalPlanBuilder::from(self.traces.clone())
            .aggregate(
                Vec::<Expr>::new(),
                vec![self.floor.call(vec![col(&column), lit(q)])],
            )?
            .build()?;
        let plan = LogicalPlanBuilder::from(self.traces.clone())
            .filter(col(&column).gt_eq(scalar_subquery(Arc::new(threshold))))?
            .build()?;
        Ok(Arc::new(ViewTable::new(plan, None)))
    }
}
