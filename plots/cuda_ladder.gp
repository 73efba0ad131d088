# The CUDA ladder against PyTorch's SDPA backends: forward (and backward) TFLOP/s vs N,
# from cuda/run_h200.sh's CSV (columns: kernel,dtype,batch,heads,heads_k,seqlen_q,seqlen_k,d,
# causal,window_left,window_right,softcap,repeats,ms_median,ms_min,ms_max,tflops,probe_tflops,
# frac_probe,check,note). Four panels: d = 128 / 64, non-causal / causal; 16 heads (the GQA rows
# are left out); the gray line is the FP32 FMA ceiling measured in the same run (median).
# Called as: gnuplot -e "csv='cuda/results/h200.csv'; out='FILE.png'" plots/cuda_ladder.gp
# (add tc='cuda/results/tc3/h200_tc3.csv'; out_tc='FILE2.png' for the tensor-core figure at the end)
set terminal pngcairo size 1300,950 font ",10" noenhanced
set output out
set datafile separator ","
stats csv using ((strcol(18) ne "" && $18 > 0) ? $18 : NaN) every ::1 nooutput name "PR"
probe = PR_median
sel(k, d, c) = sprintf("< awk -F, '$1==\"%s\" && $8==%d && $9==%d && $4==16 && $5==16 && $17!=\"\" && $17!=\"nan\"' %s | sort -t, -k6,6n", k, d, c, csv)
set logscale x 2
set logscale y 10
set xrange [800:20000]
set xtics ("1k" 1024, "4k" 4096, "16k" 16384)
set grid
set yrange [0.5:1000]
set xlabel "sequence length N (batch = 16384 / N, 16 heads, bf16)"
set ylabel "TFLOP/s (FlashAttention's count)"
set multiplot layout 2,2 title sprintf("CUDA ladder vs PyTorch SDPA on one H200 (same run); FP32 FMA ceiling measured %.1f TFLOP/s", probe)
do for [d in "128 64"] {
  do for [c in "0 1"] {
    set title sprintf("d = %s, %s", d, c == "1" ? "causal" : "non-causal")
    if (d eq "128" && c eq "0") { set key left bottom Left reverse font ",9" } else { unset key }
    dd = d + 0
    cc = c + 0
    plot sel("01_naive", dd, cc)          using 6:17 with linespoints lw 2 pt 1 title "01 naive", \
         sel("02_flash1", dd, cc)         using 6:17 with linespoints lw 2 pt 2 title "02 flash1", \
         sel("03_flash2", dd, cc)         using 6:17 with linespoints lw 3 pt 7 title "03 flash2 fwd", \
         sel("03b_flash2_bwd", dd, cc)    using 6:17 with linespoints lw 2 pt 5 dt 2 title "03b flash2 bwd", \
         sel("sdpa_flash", dd, cc)        using 6:17 with linespoints lw 1 pt 6 title "SDPA flash fwd", \
         sel("sdpa_cudnn", dd, cc)        using 6:17 with linespoints lw 1 pt 4 title "SDPA cuDNN fwd", \
         sel("sdpa_efficient", dd, cc)    using 6:17 with linespoints lw 1 pt 8 title "SDPA mem-efficient fwd", \
         sel("sdpa_flash_bwd", dd, cc)    using 6:17 with linespoints lw 1 pt 6 dt 2 title "SDPA flash bwd", \
         probe with lines lc rgb "gray40" dt 4 title "FP32 FMA ceiling"
  }
}
unset multiplot

# Part 2 (tensor cores), when called with tc='cuda/results/tc3/h200_tc3.csv' and out_tc='FILE.png':
# every rung and SDPA backend timed at the target shape (bf16, d = 128, N = 16384, 16 heads) in that
# one run, forward and backward, non-causal and causal side by side (the kernels of `order` that the
# CSV has). tc_title= overrides the title: make plots draws cuda_pingpong.png from run_tc4.sh's CSV.
if (exists("tc") && exists("out_tc")) {
  set terminal pngcairo size 1300,600 font ",10" noenhanced
  set output out_tc
  unset logscale
  unset multiplot
  set datafile separator whitespace
  set style data histograms
  set style histogram clustered gap 1
  set style fill solid 0.8 border -1
  set boxwidth 0.9
  set xtics rotate by 30 right nomirror
  set bmargin 7
  set rmargin 3
  set lmargin 10
  set size 1,1
  set origin 0,0
  set autoscale x
  set yrange [0:*]
  set ylabel "TFLOP/s (FlashAttention's count; backward 2.5x forward)"
  unset xlabel
  set key left top
  set grid ytics
  if (!exists("tc_title")) { tc_title = "Tensor-core rungs vs PyTorch SDPA on one H200, same run (bf16, d = 128, N = 16384, 16 heads)" }
  set title tc_title
  order = "03_flash2 04_mma 05_hopper 05ws_hopper_tma 05pp_hopper_pingpong sdpa_flash sdpa_cudnn sdpa_efficient 04b_mma_bwd 04bd_mma_bwd_det sdpa_flash_bwd sdpa_cudnn_bwd sdpa_efficient_bwd"
  tab = sprintf("< awk -F, -v order='%s' 'NR>1 && $2==\"bf16\" && $8==128 && $6==16384 && $4==16 && $5==16 && $17!=\"\" {t[$1\",\"$9]=$17} END {n=split(order,o,\" \"); for (i=1;i<=n;i++) if ((o[i]\",0\") in t || (o[i]\",1\") in t) printf \"%%s %%s %%s\\n\", o[i], ((o[i]\",0\") in t ? t[o[i]\",0\"] : \"NaN\"), ((o[i]\",1\") in t ? t[o[i]\",1\"] : \"NaN\")}' %s", order, tc)
  plot tab using 2:xtic(1) title "non-causal" lc rgb "#4477aa", '' using 3 title "causal (halved FLOP count)" lc rgb "#ee8866"
}
