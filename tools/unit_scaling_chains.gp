# Data RMS per layer of 16-layer chains under unit_scaling, with the earlier and the current per-op scale rules (docs/ops.md),
# from tools/unit_scaling_report's .dat files. Run by cmake/unit_scaling_report.cmake:
#   gnuplot -e "data='DIR'; out='FILE.png'" tools/unit_scaling_chains.gp
set terminal pngcairo size 1400,680 font "DejaVu Sans,11" noenhanced
set output out
set multiplot layout 1,2 title "Data RMS per layer, unit-normal inputs (green band: the target 0.5 - 2)"
set logscale y
set format y "1e%L"
set xrange [0.5:16.5]
set yrange [1e-6:1e3]
set xtics 1,1,16
set xlabel "layer"
set ylabel "data RMS"
set key outside below maxrows 4 font ",9"
set style fill transparent solid 0.2 noborder
set datafile missing "NaN"
chains = data."/unit_scaling_chains.dat"
grads = data."/unit_scaling_grads.dat"

set title "Forward activations (MLPs: K = 1024; residual x + xW: K = 256, e4m3fn)"
plot [0.5:16.5] "+" using 1:(0.5):(2.0) with filledcurves lc rgb "#4daf4a" notitle, \
  chains using 1:2 with linespoints dt 2 pt 6 lc rgb "#e41a1c" title "relu MLP, before", \
  chains using 1:3 with linespoints pt 7 lc rgb "#e41a1c" title "relu MLP, now", \
  chains using 1:4 with linespoints dt 2 pt 6 lc rgb "#377eb8" title "gelu MLP, before", \
  chains using 1:5 with linespoints pt 7 lc rgb "#377eb8" title "gelu MLP, now", \
  chains using 1:6 with linespoints dt 2 pt 4 lc rgb "#984ea3" title "residual, before (pow2; layers with NaN/inf left out)", \
  chains using 1:7 with linespoints pt 5 lc rgb "#984ea3" title "residual, now, float scales", \
  chains using 1:8 with linespoints dt 3 pt 4 lc rgb "#ff7f00" title "residual, now, pow2 alone", \
  chains using 1:9 with linespoints pt 5 lc rgb "#ff7f00" title "residual, now, pow2 + dynamic_rescale_l2"

set title "Weight gradients of the MLPs (K = 1024, batch 64)"
plot [0.5:16.5] "+" using 1:(0.5):(2.0) with filledcurves lc rgb "#4daf4a" notitle, \
  grads using 1:2 with linespoints dt 2 pt 6 lc rgb "#e41a1c" title "relu MLP, before", \
  grads using 1:3 with linespoints pt 7 lc rgb "#e41a1c" title "relu MLP, now", \
  grads using 1:4 with linespoints dt 2 pt 6 lc rgb "#377eb8" title "gelu MLP, before", \
  grads using 1:5 with linespoints pt 7 lc rgb "#377eb8" title "gelu MLP, now"
unset multiplot
