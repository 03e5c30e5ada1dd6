//! One adapter from an aggregate state with a compact binary encoding to DataFusion's
//! aggregate traits. `stage_stats`, `per_metric` and `trace_counts` each say how
//! their state takes its arguments, adds a batch, merges and encodes ([`BinaryState`]);
//! the adapter supplies the rest once: the UDAF (its result and its partial state are
//! that encoding, `Binary`), the accumulator without groups and, for states that add
//! rows per group, the groups accumulator (with `convert_to_state`).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, BinaryArray, BooleanArray};
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::common::{DataFusionError, Result, ScalarValue, not_impl_err};
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, EmitTo, GroupsAccumulator, Signature, Volatility,
};

/// Whether an argument of type `t` reads as integer nanoseconds: an integer, a NULL or a
/// nanosecond timestamp (a hop's stamp).
pub(crate) fn nanoseconds(t: &DataType) -> bool {
    t.is_integer()
        || t.is_null()
        || matches!(
            t,
            DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Nanosecond, _)
        )
}

/// An error for a state that does not decode.
pub(crate) fn corrupt(what: &str) -> DataFusionError {
    DataFusionError::Execution(format!("internal: malformed {what} state"))
}

/// The state of an aggregate whose result is its own binary encoding.
pub(crate) trait BinaryState: Default + fmt::Debug + Send + Sync + 'static {
    /// The aggregate's name.
    const NAME: &'static str;
    /// The suffix of its partial state's field name.
    const STATE: &'static str;
    /// Whether it adds rows per group natively ([`Self::update_groups`]).
    const GROUPED: bool;

    /// The argument types it reads for the types it was called with, or a plan error
    /// naming what it takes.
    fn coerce(arg_types: &[DataType]) -> Result<Vec<DataType>>;

    /// Adds a batch of its (coerced) arguments.
    fn update(&mut self, values: &[ArrayRef]) -> Result<()>;

    /// Adds a batch to the groups its rows belong to, the rows outside `filter` left
    /// out; called only when [`Self::GROUPED`].
    fn update_groups(
        groups: &mut [Self],
        values: &[ArrayRef],
        group_indices: &[usize],
        filter: Option<&BooleanArray>,
    ) -> Result<()> {
        let _ = (groups, values, group_indices, filter);
        not_impl_err!("{} has no groups accumulator", Self::NAME)
    }

    /// Adds `other`'s rows.
    fn merge(&mut self, other: &Self);

    /// The binary encoding (the result and the partial state).
    fn encode(&self) -> Vec<u8>;

    /// Reads [`Self::encode`]'s bytes; an error for anything else.
    fn decode(bytes: &[u8]) -> Result<Self>;

    /// Heap bytes it holds, for DataFusion's memory accounting.
    fn allocated_bytes(&self) -> usize {
        0
    }
}

/// The aggregate of state `S` (not registered in sessions: callers read its result with
/// the state's own decoder).
pub(crate) fn udaf<S: BinaryState>() -> AggregateUDF {
    AggregateUDF::from(BinaryAgg::<S> {
        signature: Signature::user_defined(Volatility::Immutable),
        state: PhantomData,
    })
}

struct BinaryAgg<S> {
    signature: Signature,
    state: PhantomData<fn() -> S>,
}

impl<S: BinaryState> fmt::Debug for BinaryAgg<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BinaryAgg").field("name", &S::NAME).finish()
    }
}

impl<S> PartialEq for BinaryAgg<S> {
    fn eq(&self, other: &Self) -> bool {
        self.signature == other.signature
    }
}

impl<S> Eq for BinaryAgg<S> {}

impl<S> Hash for BinaryAgg<S> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.signature.hash(state);
    }
}

impl<S: BinaryState> AggregateUDFImpl for BinaryAgg<S> {
    fn name(&self) -> &str {
        S::NAME
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        S::coerce(arg_types)
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Binary)
    }

    fn accumulator(&self, _args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        Ok(Box::new(One::<S>::default()))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        Ok(vec![Arc::new(Field::new(
            format!("{}_{}", args.name, S::STATE),
            DataType::Binary,
            true,
        ))])
    }

    fn groups_accumulator_supported(&self, _args: AccumulatorArgs) -> bool {
        S::GROUPED
    }

    fn create_groups_accumulator(
        &self,
        _args: AccumulatorArgs,
    ) -> Result<Box<dyn GroupsAccumulator>> {
        if S::GROUPED {
            Ok(groups::<S>())
        } else {
            not_impl_err!("{} has no groups accumulator", S::NAME)
        }
    }
}

/// A groups accumulator of state `S` (for a state that is [`BinaryState::GROUPED`]).
pub(crate) fn groups<S: BinaryState>() -> Box<dyn GroupsAccumulator> {
    Box::new(Groups::<S> { groups: Vec::new() })
}

/// The states of a partial-state column, decoded, with their rows.
fn decoded<S: BinaryState>(states: &[ArrayRef]) -> impl Iterator<Item = Result<(usize, S)>> + '_ {
    states.iter().take(1).flat_map(|c| {
        c.as_binary::<i32>()
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.map(|b| S::decode(b).map(|s| (i, s))))
    })
}

fn binary_of<'a, S: BinaryState>(states: impl Iterator<Item = &'a S>) -> ArrayRef {
    Arc::new(BinaryArray::from_iter_values(states.map(S::encode)))
}

/// The aggregate over all rows (no groups).
#[derive(Debug, Default)]
struct One<S> {
    state: S,
}

impl<S: BinaryState> Accumulator for One<S> {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        self.state.update(values)
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(ScalarValue::Binary(Some(self.state.encode())))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self) + self.state.allocated_bytes()
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        for s in decoded::<S>(states) {
            self.state.merge(&s?.1);
        }
        Ok(())
    }
}

/// The aggregate of every group at once.
#[derive(Debug)]
struct Groups<S> {
    groups: Vec<S>,
}

impl<S: BinaryState> Groups<S> {
    fn emit(&mut self, emit_to: EmitTo) -> ArrayRef {
        binary_of(emit_to.take_needed(&mut self.groups).iter())
    }

    fn grow(&mut self, total_num_groups: usize) {
        self.groups.resize_with(total_num_groups, S::default);
    }
}

impl<S: BinaryState> GroupsAccumulator for Groups<S> {
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        S::update_groups(&mut self.groups, values, group_indices, opt_filter)
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        Ok(self.emit(emit_to))
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        Ok(vec![self.emit(emit_to)])
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.grow(total_num_groups);
        for s in decoded::<S>(values) {
            let (i, s) = s?;
            self.groups[group_indices[i]].merge(&s);
        }
        Ok(())
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let rows = values.first().map_or(0, |v| v.len());
        let mut states: Vec<S> = (0..rows).map(|_| S::default()).collect();
        let each: Vec<usize> = (0..rows).collect();
        S::update_groups(&mut states, values, &each, opt_filter)?;
        Ok(vec![binary_of(states.iter())])
    }

    fn size(&self) -> usize {
        self.groups.capacity() * std::mem::size_of::<S>()
            + self.groups.iter().map(S::allocated_bytes).sum::<usize>()
    }
}
