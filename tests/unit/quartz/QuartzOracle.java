// Quartz 2.3.2's own answers, for the differential test of celery_ratchet's cron evaluator.
// Reads lines "expression<TAB>zone<TAB>start-epoch-ms<TAB>count" from stdin; prints, per
// line, "OK<TAB>t1,t2,..." (epoch ms) or "ERROR<TAB>message".
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.Date;
import java.util.TimeZone;
import org.quartz.CronExpression;

public class QuartzOracle {
  public static void main(String[] args) throws Exception {
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
    StringBuilder out = new StringBuilder();
    String line;
    while ((line = in.readLine()) != null) {
      String[] parts = line.split("\t");
      try {
        CronExpression cron = new CronExpression(parts[0]);
        cron.setTimeZone(TimeZone.getTimeZone(parts[1]));
        Date t = new Date(Long.parseLong(parts[2]));
        int count = Integer.parseInt(parts[3]);
        StringBuilder times = new StringBuilder();
        for (int i = 0; i < count; i++) {
          t = cron.getTimeAfter(t);
          if (t == null) break;
          if (i > 0) times.append(',');
          times.append(t.getTime());
        }
        out.append("OK\t").append(times).append('\n');
      } catch (Exception e) {
        out.append("ERROR\t").append(String.valueOf(e.getMessage()).replace('\n', ' ')).append('\n');
      }
    }
    System.out.print(out);
  }
}
