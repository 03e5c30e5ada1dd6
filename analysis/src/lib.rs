//! hoptrace analysis: SQL over run Parquet, HDR aggregates, reports and charts.
