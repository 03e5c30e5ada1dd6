import java.io.File;
import org.HdrHistogram.EncodableHistogram;
import org.HdrHistogram.Histogram;
import org.HdrHistogram.HistogramLogReader;

/** Reads an interval log with HdrHistogram's own reader and prints the merged totals. */
public class HlogCheck {
    public static void main(String[] args) throws Exception {
        HistogramLogReader reader = new HistogramLogReader(new File(args[0]));
        Histogram total = new Histogram(3);
        int intervals = 0;
        EncodableHistogram h;
        while ((h = reader.nextIntervalHistogram()) != null) {
            total.add((Histogram) h);
            intervals++;
        }
        System.out.printf("intervals=%d count=%d p50=%d p99=%d max=%d%n", intervals,
            total.getTotalCount(), total.getValueAtPercentile(50.0),
            total.getValueAtPercentile(99.0), total.getMaxValue());
    }
}
